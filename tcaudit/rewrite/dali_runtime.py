"""The code ``tcaudit fix --dali`` puts into a training script, kept as a module so that it is
tested and linted like the rest. Everything from the ``# -- tcaudit fix --dali`` line down is copied
as it is after the script's imports. It imports nothing at module level (the script may import torch
under another name, or not at all) and never imports tcaudit: the converted script stays
self-contained.
"""

# -- tcaudit fix --dali: the training images are decoded on the GPU ------------------------------
# tcaudit_dali_loader(loader) takes a DataLoader over an ImageFolder whose transform is
# RandomResizedCrop, RandomHorizontalFlip, ToTensor (or PILToTensor), Normalize, and returns one of:
#   dali:   a DALI pipeline (pip install nvidia-dali-cuda130; it decodes on the GPU, or on the CPU
#           when there is none);
#   nvjpeg: workers that only read the files while torchvision decodes each batch at once (nvjpeg)
#           and crops, flips and normalizes it with batched GPU ops, a batch ahead on a side stream;
#   cpu:    the loader itself.
# On a GPU it times a few batches of each one it can build, on throwaway iterators before the first
# epoch (the epoch's batches are neither lost nor repeated; a RandomSampler draws one more seed), and
# keeps the fastest (under DDP, rank 0's pick); TCAUDIT_INPUT=dali|nvjpeg|cpu forces one. Batches
# stay (images, target): images [B, 3, H, W] as the transform made them, target int64 [B] (on the
# decoding device). nhwc=True: the images are channels_last in memory, for a model converted to
# channels_last. device: where to decode (by default the current GPU when there is one; without DALI
# and a GPU, the loader is kept).
# probe: time the candidates (by default only when decoding on a GPU, where speed is the question).


class TcauditJpegFiles:
    """An ImageFolder's samples as (file bytes, class index): the workers only read files."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            return f.read(), target

    @staticmethod
    def collate(items):
        """One uint8 tensor of all the files' bytes, their lengths and labels: one shared-memory
        block per batch rather than one per file."""
        import torch

        data = b"".join(item for item, _ in items)
        packed = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        lengths = torch.tensor([len(item) for item, _ in items], dtype=torch.int64)
        return packed, lengths, torch.tensor([target for _, target in items], dtype=torch.int64)


class TcauditGpuLoader:
    """Iterates and has a len() like the DataLoader it replaces; other attributes are its."""

    def __init__(self, loader, batches, length, kind):
        self.loader, self.batches, self.length, self.kind = loader, batches, length, kind

    def __len__(self):
        return self.length

    def __iter__(self):
        return self.batches()

    def __getattr__(self, name):
        return getattr(vars(self).get("loader"), name)


def tcaudit_crop_boxes(heights, widths, scale, ratio, generator):
    """RandomResizedCrop.get_params for a whole batch: (top, left, height, width) int64 tensors.
    The same draws per sample (ten tries of an area and a log-uniform aspect ratio, the first that
    fits, else the centre crop clamped to the ratio range), made for every sample at once."""
    import math

    import torch

    heights = torch.as_tensor(heights, dtype=torch.float64)
    widths = torch.as_tensor(widths, dtype=torch.float64)
    count = len(heights)
    area = (heights * widths)[:, None]
    target_area = area * torch.empty(count, 10, dtype=torch.float64).uniform_(scale[0], scale[1], generator=generator)
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.empty(count, 10, dtype=torch.float64).uniform_(*log_ratio, generator=generator).exp()
    w = (target_area * aspect).sqrt().round()
    h = (target_area / aspect).sqrt().round()
    fits = (w > 0) & (w <= widths[:, None]) & (h > 0) & (h <= heights[:, None])
    first = fits.to(torch.int8).argmax(1, keepdim=True)
    found = fits.any(1)
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
    in_ratio = widths / heights
    low, high = min(ratio), max(ratio)
    fallback_w = torch.where(in_ratio > high, (heights * high).round(), widths)
    fallback_h = torch.where(in_ratio < low, (widths / low).round(), heights)
    w, h = torch.where(found, w, fallback_w), torch.where(found, h, fallback_h)
    spare_h, spare_w = heights - h, widths - w
    draw = torch.rand(count, 2, dtype=torch.float64, generator=generator)
    top = torch.where(found, (draw[:, 0] * (spare_h + 1)).floor(), (spare_h / 2).floor())
    left = torch.where(found, (draw[:, 1] * (spare_w + 1)).floor(), (spare_w / 2).floor())
    return top.long(), left.long(), h.long(), w.long()


def tcaudit_decode_batch(packed, lengths, device):
    """The batch's files as uint8 [3, H, W] images on ``device``: the JPEGs in one batched decode
    (nvjpeg on a GPU), grey and CMYK ones converted to RGB; a file the batched decode refuses (a PNG,
    a JPEG nvjpeg cannot read) alone, on the CPU."""
    import torch
    import torchvision

    rgb = torchvision.io.ImageReadMode.RGB
    files = list(torch.split(packed, lengths.tolist()))
    images = [None] * len(files)
    jpegs = [i for i, data in enumerate(files) if data[:3].tolist() == [0xFF, 0xD8, 0xFF]]
    try:
        decoded = torchvision.io.decode_jpeg([files[i] for i in jpegs], mode=rgb, device=device) if jpegs else []
    except RuntimeError:  # one file spoils a batched decode: each alone, below
        decoded = [None] * len(jpegs)
    for i, image in zip(jpegs, decoded):
        images[i] = image
    for i, image in enumerate(images):
        if image is None:
            images[i] = torchvision.io.decode_image(files[i], mode=rgb).to(device)
    return images


def tcaudit_augment_batch(images, size, scale, ratio, flip, mean, std, to_float, generator):
    """RandomResizedCrop (bilinear, antialiased), RandomHorizontalFlip, then ToTensor + Normalize (or
    PILToTensor) on a list of uint8 [3, H, W] images: [B, 3, *size]. Crop boxes are drawn on the host;
    images of one size are resampled together by roi_align, whose adaptive sampling averages
    ceil(crop/output) points per pixel and side, as an antialiased resize does."""
    import torch
    from torchvision.ops import roi_align

    device = images[0].device
    top, left, h, w = tcaudit_crop_boxes([i.shape[1] for i in images], [i.shape[2] for i in images],
                                         scale, ratio, generator)
    flips = torch.rand(len(images), generator=generator) < flip
    boxes = torch.stack([left, top, left + w, top + h], 1).to(torch.float32)
    out = torch.empty(len(images), 3, *size, device=device)
    by_size = {}
    for index, image in enumerate(images):
        by_size.setdefault(tuple(image.shape), []).append(index)
    for members in by_size.values():
        group = torch.stack([images[i] for i in members]).float()
        rois = torch.cat([torch.arange(len(members), dtype=torch.float32)[:, None], boxes[members]], 1)
        resized = roi_align(group, rois.to(device), list(size), 1.0, -1, True)
        out.index_copy_(0, torch.tensor(members, device=device), resized)
    flips = flips.to(device)[:, None, None, None]
    out = torch.where(flips, out.flip(-1), out)
    if to_float:
        return out.sub_(mean).div_(std)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def tcaudit_dali_loader(loader, nhwc=False, device=None, probe=None):
    import os
    import sys
    import time

    import torch

    def say(what):
        print(f"tcaudit_dali_loader: {what}", file=sys.stderr)

    dataset, sampler = loader.dataset, loader.sampler
    steps = list(getattr(getattr(dataset, "transform", None), "transforms", ()))
    names = [type(step).__name__ for step in steps]
    to_tensor = "PILToTensor" if "PILToTensor" in names else "ToTensor"
    order = ["RandomResizedCrop", "RandomHorizontalFlip", to_tensor]
    order += ["Normalize"] if to_tensor == "ToTensor" else []
    converted_transform = (
        names[:1] == ["RandomResizedCrop"] and to_tensor in names
        and names == [name for name in order if name in names]
        and str(steps[0].interpolation).lower().endswith("bilinear")
    )
    plain_loader = (
        hasattr(dataset, "samples") and getattr(dataset, "target_transform", None) is None
        and loader.collate_fn is torch.utils.data.default_collate and loader.batch_size
        and type(loader.batch_sampler) is torch.utils.data.BatchSampler
        and type(sampler).__name__ in ("RandomSampler", "SequentialSampler", "DistributedSampler")
    )
    if not (converted_transform and plain_loader):
        say("kept the DataLoader (its dataset, transform or sampler changed)")
        return loader
    forced = os.environ.get("TCAUDIT_INPUT", "").strip().lower()
    if forced not in ("", "dali", "nvjpeg", "cpu"):
        raise RuntimeError(f"TCAUDIT_INPUT={forced!r}: expected dali, nvjpeg or cpu")
    crop, by_name = steps[0], dict(zip(names, steps))
    flip = by_name["RandomHorizontalFlip"].p if "RandomHorizontalFlip" in by_name else 0.0
    scale = 255.0 if to_tensor == "ToTensor" else 1.0  # ToTensor maps 0..255 to 0..1
    normalize = by_name.get("Normalize")
    mean = [scale * float(m) for m in normalize.mean] if normalize else [0.0]
    std = [scale * float(s) for s in normalize.std] if normalize else [scale]
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = getattr(sampler, "rank", torch.distributed.get_rank() if distributed else 0)
    world = torch.distributed.get_world_size() if distributed else 1
    shards = getattr(sampler, "num_replicas", world)
    shuffle = getattr(sampler, "shuffle", type(sampler).__name__ == "RandomSampler")
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    device = device and torch.device(device)
    gpu = device is not None and device.type == "cuda"
    candidates, why_not = {}, {}  # name: (a function building a fresh loader, what it is)

    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError:
        why_not["dali"] = "DALI is not installed"
    else:
        threads = max(1, min(loader.num_workers or 4, os.cpu_count() or 1))
        device_id = (device.index or 0) if gpu else None  # None: DALI's CPU-only mode

        @pipeline_def(batch_size=loader.batch_size, num_threads=threads, device_id=device_id,
                      seed=torch.initial_seed() % 2**31)
        def pipeline():
            files, target = fn.readers.file(
                files=[path for path, _ in dataset.samples],
                labels=[label for _, label in dataset.samples],
                shuffle_after_epoch=shuffle, shard_id=rank, num_shards=shards, name="files",
            )
            images = fn.decoders.image_random_crop(
                files, device="mixed" if gpu else "cpu", output_type=types.RGB,
                random_area=list(crop.scale), random_aspect_ratio=list(crop.ratio),
            )
            images = fn.resize(images, resize_x=crop.size[1], resize_y=crop.size[0])
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT if to_tensor == "ToTensor" else types.UINT8,
                output_layout="HWC" if nhwc else "CHW", mean=mean, std=std,
                mirror=fn.random.coin_flip(probability=flip),
            )
            return images, target.gpu() if gpu else target

        def dali_loader():
            last_batch = LastBatchPolicy.DROP if loader.drop_last else LastBatchPolicy.PARTIAL
            dali = DALIGenericIterator(pipeline(), ["images", "target"], reader_name="files",
                                       auto_reset=True, last_batch_policy=last_batch)

            def dali_batches():
                for (batch,) in dali:
                    images = batch["images"]  # [B, H, W, C] seen as [B, C, H, W]: channels_last
                    images = images.permute(0, 3, 1, 2) if nhwc else images
                    yield images, batch["target"].view(-1).long()

            return TcauditGpuLoader(loader, dali_batches, len(dali), candidates["dali"][1])

        candidates["dali"] = (dali_loader, f"DALI, decoding on {device}" if gpu else "DALI, decoding on the CPU (no GPU)")

    if device is None:
        why_not["nvjpeg"] = "no GPU"
    else:
        import itertools
        import queue
        import threading

        files_sampler = sampler
        if shards > 1 and not hasattr(sampler, "num_replicas"):
            files_sampler = torch.utils.data.DistributedSampler(dataset, shuffle=shuffle)
        files = torch.utils.data.DataLoader(
            TcauditJpegFiles(dataset.samples), batch_size=loader.batch_size, sampler=files_sampler,
            drop_last=loader.drop_last, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
            collate_fn=TcauditJpegFiles.collate, persistent_workers=loader.persistent_workers,
            prefetch_factor=loader.prefetch_factor, multiprocessing_context=loader.multiprocessing_context,
        )
        mean_on = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        std_on = torch.tensor(std, device=device).view(1, -1, 1, 1)

        def decoded_batches(epochs):
            """A thread decodes and augments up to two batches ahead of the loop, on a side stream
            when on a GPU; an event tells the loop's stream when a batch is ready."""
            if files_sampler is not sampler:
                files_sampler.set_epoch(next(epochs))  # a sampler of ours: the script reseeds only its own
            batches = iter(files)  # here, so that the sampler draws its order in the script's thread
            seed = torch.empty((), dtype=torch.int64).random_().item()
            generator = torch.Generator().manual_seed(seed)
            side = torch.cuda.Stream(device) if gpu else None
            ready, stop = queue.Queue(maxsize=2), threading.Event()

            def hand_over(item):
                while not stop.is_set():
                    try:
                        return ready.put(item, timeout=0.1)
                    except queue.Full:
                        pass

            def produce():
                try:
                    if gpu:
                        torch.cuda.set_device(device)
                    with torch.cuda.stream(side):  # None: no stream to switch to
                        for packed, lengths, target in batches:
                            images = tcaudit_decode_batch(packed, lengths, device)
                            images = tcaudit_augment_batch(
                                images, list(crop.size), crop.scale, crop.ratio, flip, mean_on, std_on,
                                to_tensor == "ToTensor", generator,
                            )
                            if nhwc:  # channels_last in memory
                                images = images.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
                            target = target.to(device, non_blocking=True)
                            event = torch.cuda.Event() if gpu else None
                            if gpu:
                                event.record(side)
                            hand_over((images, target, event))
                            if stop.is_set():
                                return
                    hand_over(None)
                except BaseException as error:  # raised again in the training loop's thread
                    hand_over(error)

            worker = threading.Thread(target=produce, name="tcaudit-decode", daemon=True)
            worker.start()
            try:
                while True:
                    item = ready.get()
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    images, target, event = item
                    if gpu:
                        stream = torch.cuda.current_stream(device)
                        stream.wait_event(event)
                        images.record_stream(stream)  # made on the side stream, used on this one
                        target.record_stream(stream)
                    yield images, target
            finally:
                stop.set()
                while worker.is_alive():
                    try:
                        ready.get(timeout=0.1)
                    except queue.Empty:
                        pass

        def nvjpeg_loader():  # its own count of epochs: the probe's throwaway loader does not advance it
            epochs = itertools.count()
            return TcauditGpuLoader(loader, lambda: decoded_batches(epochs), len(files), candidates["nvjpeg"][1])

        candidates["nvjpeg"] = (nvjpeg_loader, f"torchvision, decoding on {device} (the workers read the files)")
    candidates["cpu"] = (lambda: loader, "the DataLoader as written")

    def build(name):
        try:
            return candidates[name][0]()
        except RuntimeError as error:  # DALI installed but unusable here (driver, CUDA version)
            why_not[name] = f"{'DALI' if name == 'dali' else name} failed: {str(error).splitlines()[0]}"
            say(why_not[name])
            del candidates[name]

    if forced:
        built = build(forced) if forced in candidates else None
        if built is None:
            raise RuntimeError(f"TCAUDIT_INPUT={forced}: {why_not.get(forced)}")
        say(f"{candidates[forced][1]} (TCAUDIT_INPUT={forced})")
        return built
    if device is None and "dali" not in candidates:
        say("kept the DataLoader (no DALI, no GPU)")
        return loader
    if probe is None:
        probe = gpu
    if not probe:
        for name in list(candidates):
            built = build(name)
            if built is not None:
                say(candidates[name][1])
                return built
    # Timed from a fresh iterator, so worker and pipeline start-up count, over enough batches that
    # every worker delivers about twice: a prefetched queue alone would flatter the CPU workers.
    count = max(4, 2 * (loader.num_workers or 1))
    count = min(count, len(loader)) if len(loader) else count
    rates = {}
    for name in list(candidates):
        built = build(name)
        if built is None:
            continue
        start, images = time.perf_counter(), 0
        batches = iter(built)
        for _, (_, target) in zip(range(count), batches):
            images += len(target)
        if gpu:
            torch.cuda.synchronize(device)
        rates[name] = images / (time.perf_counter() - start)
        del batches, built
    best = max(rates, key=rates.get)
    if distributed:  # every rank must run the same pipeline, or their batch counts could differ
        chosen = [best]
        torch.distributed.broadcast_object_list(chosen, src=0)
        best = chosen[0] if chosen[0] in rates else best
    measured = ", ".join(f"{name} {rate:.0f}" for name, rate in sorted(rates.items(), key=lambda kv: -kv[1]))
    skipped = "".join(f"; no {name}: {why}" for name, why in why_not.items())
    which = "rank 0's pick" if distributed else "the fastest"
    say(f"{candidates[best][1]}: {which} of {measured} images/s over {count} batches each "
        f"(timed before the first epoch{skipped}; TCAUDIT_INPUT=dali|nvjpeg|cpu forces one)")
    return candidates[best][0]()
