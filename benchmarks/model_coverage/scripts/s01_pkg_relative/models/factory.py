from .preact import PreActNet

_ARCHS = {"preact18": (2, 2, 2, 2), "preact10": (1, 1, 1, 1)}


def build_model(arch, num_classes):
    return PreActNet(_ARCHS[arch], num_classes)
