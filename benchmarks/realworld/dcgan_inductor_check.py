"""Does a compiled channels_last DCGAN train, with the generator's noise in each memory layout?

The DCGAN ceiling failed on an H200 (torch 2.11) inside the compiled generator's backward:
`assert_size_stride(buf, (100, 512, 4, 4), (8192, 1, 2048, 512))` in `convolution_backward`, the
weight gradient of the first ConvTranspose2d. Its input, the noise (b, nz, 1, 1), has NCHW strides that
are channels_last-contiguous too; cuDNN's transposed-conv backward picks the weight gradient's layout
from the input (NCHW) while the fake-tensor rule inductor uses picks it from the weight
(channels_last). `tcaudit fix` (TC303) and the ceiling now copy the noise with
`.to(memory_format=torch.channels_last)`. This script checks that on the GPU, each variant in its own
process (a crash must not take the others with it):

  nchw_noise        torch.randn(b, nz, 1, 1)                                 (expected: fails on torch 2.11)
  contiguous_noise  ... .contiguous(memory_format=torch.channels_last)       (a no-op here: expected to fail too)
  cl_noise          ... .to(memory_format=torch.channels_last)               (the remedy: expected to run)

Both nets are channels_last and compiled in place (`.compile()`, as `tcaudit fix --compile` writes it),
bf16 autocast, DCGAN's sizes (nz 100, 64x64, ngf = ndf = 64), three GAN steps each.

    python3 benchmarks/realworld/dcgan_inductor_check.py [--batch-size 128] [--out check.json]

Exit 0 when the remedy runs (whatever the others do), 1 when it fails. On a CPU it runs too (with
--tiny for speed), but the failure is cuDNN's: there every variant is expected to pass.
"""
import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = ("nchw_noise", "contiguous_noise", "cl_noise")


def train(variant: str, batch_size: int, size: int, width: int, steps: int) -> float:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    nz, nc, ngf, ndf = 100, 3, width, width
    cl = torch.channels_last
    g_layers = [nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True)]
    d_layers = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
    channels, spatial = ngf * 8, 4
    while spatial * 2 < size:
        g_layers += [nn.ConvTranspose2d(channels, channels // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(channels // 2),
                     nn.ReLU(True)]
        channels //= 2
        spatial *= 2
    g_layers += [nn.ConvTranspose2d(channels, nc, 4, 2, 1, bias=False), nn.Tanh()]
    channels, spatial = ndf, size // 2
    while spatial > 4:
        d_layers += [nn.Conv2d(channels, channels * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(channels * 2),
                     nn.LeakyReLU(0.2, inplace=True)]
        channels *= 2
        spatial //= 2
    d_layers += [nn.Conv2d(channels, 1, 4, 1, 0, bias=False)]

    class Net(nn.Module):  # a forward of our own: nn.Module.compile() captures nothing for a bare Sequential
        def __init__(self, layers):
            super().__init__()
            self.main = nn.Sequential(*layers)

        def forward(self, x):
            return self.main(x)

    netG = Net(g_layers).to(device).to(memory_format=cl)
    netD = Net(d_layers).to(device).to(memory_format=cl)
    netG.compile()
    netD.compile()
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    loss = float("nan")
    for _ in range(steps):
        real = (torch.rand(batch_size, nc, size, size, device=device) * 2 - 1).contiguous(memory_format=cl)
        noise = torch.randn(batch_size, nz, 1, 1, device=device)
        if variant == "contiguous_noise":
            noise = noise.contiguous(memory_format=cl)
        elif variant == "cl_noise":
            noise = noise.to(memory_format=cl)
        ones = torch.ones(batch_size, device=device)
        with autocast:
            fake = netG(noise)
            lossD = criterion(netD(real).view(-1).float(), ones) + criterion(
                netD(fake.detach()).view(-1).float(), torch.zeros_like(ones))
        optD.zero_grad()
        lossD.backward()
        optD.step()
        with autocast:
            lossG = criterion(netD(fake).view(-1).float(), ones)
        optG.zero_grad()
        lossG.backward()
        optG.step()
        loss = lossG.item()
    return loss


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=VARIANTS, help="run one variant in this process")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="16x16 images, width 8 (a CPU smoke test)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per variant")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    size, width = (16, 8) if args.tiny else (64, 64)
    if args.variant:
        print(f"loss {train(args.variant, args.batch_size, size, width, args.steps):.4f}")
        return 0

    import torch

    results = []
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--variant", variant, "--batch-size", str(args.batch_size),
                   "--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
        start = time.time()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=os.environ.copy())
            ok = proc.returncode == 0
            tail = (proc.stdout if ok else proc.stderr).strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            ok, tail = False, [f"timed out after {args.timeout}s"]
        results.append({"variant": variant, "ok": ok, "seconds": round(time.time() - start, 1), "last_lines": tail})
        print(f"{variant:18s} {'ok' if ok else 'FAILED'} ({results[-1]['seconds']}s): {tail[-1] if tail else ''}")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    summary = {"torch": torch.__version__, "device": device, "batch_size": args.batch_size, "tiny": args.tiny,
               "results": results}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=2)
    return 0 if next(r for r in results if r["variant"] == "cl_noise")["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
