from modeling import Tower


def setup_model(args):
    return Tower(args.features, args.hidden, args.layers)
