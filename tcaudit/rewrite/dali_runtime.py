"""The code ``tcaudit fix --dali`` puts into a training script, kept as a module so that it is
tested and linted like the rest. Everything from the ``# -- tcaudit fix --dali`` line down is copied
as it is after the script's imports. It imports nothing at module level (the script may import torch
under another name, or not at all) and never imports tcaudit: the converted script stays
self-contained.
"""

# -- tcaudit fix --dali: the training images are decoded on the GPU ------------------------------
# tcaudit_dali_loader(loader) takes a DataLoader over an ImageFolder whose transform is
# RandomResizedCrop, RandomHorizontalFlip, ToTensor (or PILToTensor), Normalize, and returns the
# first of: a DALI pipeline (pip install nvidia-dali-cuda120; it decodes on the GPU, or on the CPU
# when there is none); on CUDA, workers that only read the files while torchvision (nvjpeg)
# decodes, crops, flips and normalizes on the GPU; else the loader itself. Batches stay
# (images, target): images [B, 3, H, W] as the transform made them, target int64 [B]. nhwc=True:
# the images are channels_last in memory, for a model converted to channels_last. device: where to
# decode (by default the current GPU when there is one; without DALI and a GPU, the loader is kept).


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


def tcaudit_dali_loader(loader, nhwc=False, device=None):
    import itertools
    import os
    import sys

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
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError:
        fn = None
    if fn is not None:
        gpu = device is not None and device.type == "cuda"
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
            return images, target

        last_batch = LastBatchPolicy.DROP if loader.drop_last else LastBatchPolicy.PARTIAL
        try:
            dali = DALIGenericIterator(pipeline(), ["images", "target"], reader_name="files",
                                       auto_reset=True, last_batch_policy=last_batch)
        except RuntimeError as error:  # installed but unusable here (driver, CUDA version)
            say(f"DALI failed: {str(error).splitlines()[0]}")
        else:
            def dali_batches():
                for (batch,) in dali:
                    images = batch["images"]  # [B, H, W, C] seen as [B, C, H, W]: channels_last
                    images = images.permute(0, 3, 1, 2) if nhwc else images
                    yield images, batch["target"].view(-1).long()

            kind = f"DALI, decoding on {device}" if gpu else "DALI, decoding on the CPU (no GPU)"
            say(kind)
            return TcauditGpuLoader(loader, dali_batches, len(dali), kind)
    if device is None:
        say("kept the DataLoader (no DALI, no GPU)")
        return loader

    import torchvision
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms.functional import resized_crop

    if shards > 1 and not hasattr(sampler, "num_replicas"):
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=shuffle)
    files = torch.utils.data.DataLoader(
        TcauditJpegFiles(dataset.samples), batch_size=loader.batch_size, sampler=sampler,
        drop_last=loader.drop_last, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor,
        multiprocessing_context=loader.multiprocessing_context,
    )
    mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
    std = torch.tensor(std, device=device).view(1, -1, 1, 1)
    epochs = itertools.count()
    rgb = torchvision.io.ImageReadMode.RGB

    def decoded_batches():
        if sampler is not loader.sampler:
            sampler.set_epoch(next(epochs))  # a sampler of ours: the script reseeds only its own
        for data, target in files:
            encoded = [torch.frombuffer(bytearray(item), dtype=torch.uint8) for item in data]
            try:
                decoded = torchvision.io.decode_jpeg(encoded, mode=rgb, device=device)
            except RuntimeError:  # a PNG or a CMYK JPEG among them: this batch on the CPU
                decoded = [torchvision.io.decode_image(item, mode=rgb) for item in encoded]
                decoded = [image.to(device) for image in decoded]
            crops = []
            for image in decoded:
                box = RandomResizedCrop.get_params(image, list(crop.scale), list(crop.ratio))
                image = resized_crop(image, *box, list(crop.size), antialias=True)
                crops.append(image.flip(-1) if torch.rand(1).item() < flip else image)
            images = torch.stack(crops)
            if to_tensor == "ToTensor":
                images = images.float().sub_(mean).div_(std)
            if nhwc:  # channels_last in memory
                images = images.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
            yield images, target

    kind = f"torchvision, decoding on {device} (the workers read the files)"
    say(kind)
    return TcauditGpuLoader(loader, decoded_batches, len(files), kind)
