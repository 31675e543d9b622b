"""What the model audit measured about the models a script builds, for the script rules.

The audit (``tcaudit/model/``) builds each model on fake tensors and counts its FLOPs by kind; this
module holds the few numbers the script rules decide with (a convnet gets channels_last, cuDNN
benchmarking and fp16; a transformer does not, whatever the script imports), as plain frozen data.
It imports nothing of ``tcaudit.model``: the rules read these facts, never the audit's internals.
A file the audit did not reach (``--no-exec``, no static construction, a failed build) has no
profile, and the rules fall back to what they infer from the script's text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

# A model whose 2-D convolutions do at least this share of its forward FLOPs is a convnet: its eager
# speed follows the conv kernels' memory format. A ViT's patch embedding (one strided conv) stays
# far below it (ViT-S/16: ~2%); ResNets, U-Nets and DCGAN nets are above 90%.
CONVNET_SHARE = 0.5
# A step whose trained models' forwards the audit models at no more than this much device time (at the
# script's batch, at the table's peak rates) is small: its hundreds of eager launches, and the Python
# around them, take about as long as its math, and CUDA graphs (one launch a step) are what compiling
# can win there. DCGAN's two nets at batch 64 model at 0.51 ms (with the discriminator on an assumed
# 224x224 input; 0.08 ms at its real 64x64); the ResNet50, ViT-S/16, U-Net and GPT-2 of
# benchmarks/realworld model at 3.4-16 ms (measured with benchmarks/cuda_graphs.py on the H200).
SMALL_STEP_MS = 1.0


@dataclass(frozen=True)
class LinearGemm:
    """One ``nn.Linear`` of the model as its forward ran it: its module path (``h.0.mlp.c_fc``), the GEMM's
    M (batch x tokens), N (out features) and K (in features), and whether it reads the model's input or
    gives its output (the first and last layers, which FP8 training leaves in bf16)."""

    path: str
    m: int
    n: int
    k: int
    reads_input: bool = False
    gives_output: bool = False


@dataclass(frozen=True)
class ModelProfile:
    """One audited model of a script: where it is built, and how its forward FLOPs split by kind."""

    construction: str  # the construction's code, whitespace folded (``models.__dict__[args.arch]()``)
    assigned: str | None  # the name the construction is assigned to (``model``), if any
    model_class: str  # the class the audit built (``ResNet``)
    conv_share: float  # 2-D convolutions
    gemm_share: float  # linear layers and matmuls (hand-written attention included)
    attention_share: float  # fused scaled_dot_product_attention
    conv3d: bool  # any 3-D convolution (channels_last cannot take rank-5 weights)
    image_input: bool  # the forward's first input is a rank-4 floating batch
    # The GEMM, conv and attention ops average within the time an eager step takes to launch one, at
    # the script's own batch or a large one where the audit assumed it (the cost table's
    # launch.hidden_flops): a tutorial toy, whose step precision, TF32 and memory format cannot change
    # measurably (LeNet at batch 4 ran slower under fp16 autocast).
    launch_bound: bool = False
    # The forward's modelled device time at the script's batch (or the large one the audit assumed),
    # in milliseconds at the cost table's rates for the target GPU; 0 where nothing ran.
    forward_ms: float = 0.0
    # Forward FLOPs per sample (the audited input's FLOPs over its leading dimension); 0 where unknown.
    # ``verify`` reports achieved TFLOP/s and MFU from it (a training step: 3x the forward).
    flops_per_sample: float = 0.0
    # Every ``nn.Linear`` the forward ran, in order (``fix --fp8`` picks the layers to convert from them),
    # and whether the audit assumed the batch or sequence (then M is its guess, not the script's).
    linears: tuple[LinearGemm, ...] = ()
    input_assumed: bool = True

    @property
    def is_convnet(self) -> bool:
        return self.conv_share >= CONVNET_SHARE and not self.conv3d

    def describe(self) -> str:
        return (f"the model audit measured `{self.model_class}`: {self.conv_share:.0%} of its forward FLOPs "
                f"in convolutions, {self.gemm_share:.0%} in GEMMs, {self.attention_share:.0%} in attention")


def construction_key(code: str) -> str:
    """A construction's code with its whitespace folded, as both sides compare it."""
    return " ".join(code.split())


@dataclass(frozen=True)
class AuditedModels:
    """The audited models of one file, in discovery order."""

    profiles: tuple[ModelProfile, ...] = ()
    # The profiles of the models scripts of the project build and hand to this file's code (a Trainer
    # class in another module), not of models this file builds itself.
    handed_in: bool = False

    def for_site(self, name: str, construction_code: str) -> ModelProfile | None:
        """The profile of the model a script rule sees as ``name`` built by ``construction_code``:
        the same construction, else one assigned to that name (a factory the rule follows into its
        body, or a construction a fix has since edited)."""
        key = construction_key(construction_code)
        for profile in self.profiles:
            if profile.construction == key:
                return profile
        named = [p for p in self.profiles if p.assigned is not None and p.assigned == name.split(".")[-1]]
        return named[0] if len(named) == 1 else None

    def digest(self) -> str:
        """Changes whenever what the rules may read changes (for the scan cache's key)."""
        text = json.dumps([asdict(p) for p in self.profiles], sort_keys=True) + ("/handed-in" if self.handed_in else "")
        return hashlib.sha256(text.encode()).hexdigest()[:16]
