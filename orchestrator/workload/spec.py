"""One LLM training iteration as a user describes it (YAML), validated into a typed
:class:`WorkloadSpec`: the model, how it is split over the GPUs, the batch, and the GPU.

The description says only what an iteration is made of; what it costs (FLOPs, bytes of each
communication kind) is :mod:`orchestrator.workload.costs`', and the workers' program is
compiled from both elsewhere. Example (``workloads/gpt3-like.yaml``)::

    name: gpt3-like
    model: {layers: 8, hidden: 256, heads: 2, ffn_hidden: 1024, seq_len: 2048, vocab: 1024}
    parallel: {tp: 2, pp: 2, dp: auto}   # auto: the GPUs left over (needs the GPU count)
    batch: {micro_batch: 2, global_batch: 16}
    gpu: {peak_flops: 989T, efficiency: 0.45}
    precision: bf16                      # bf16 | fp16 | fp32: bytes of activations, gradients
    bucket: 25M                          # the data-parallel gradient bucket
    recompute: false

The layout checks are the ones Megatron-LM makes at start-up (``megatron/training/
arguments.py``): attention heads divide over tensor-parallel ranks, layers over pipeline
stages, routed experts over expert-parallel ranks, and the global batch into whole
micro-batches on every data-parallel rank. Given the fabric's GPU count, the layout must use
exactly those GPUs; given its GPUs per server, tensor parallelism must stay inside a server,
on NVLink, as every large training deployment keeps it (Narayanan et al. SC'21, Sec. 3.3:
tensor-parallel all-reduces are too frequent for the inter-server network).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import REPO
from orchestrator.collectives.sizes import parse_size
from topologies.catalog import is_preset_name
from topologies.errors import WorkloadError
from topologies.spec import NAME_PATTERN, NAME_TEXT, _describe, _Reader
from topologies.yamlfile import read_yaml

# What the reader checks, named once (a JSON Schema could be generated from the same facts).
TOP_KEYS = {
    "name",
    "description",
    "source",
    "model",
    "parallel",
    "batch",
    "gpu",
    "precision",
    "bucket",
    "recompute",
}
REQUIRED_KEYS = ("name", "model", "parallel", "batch", "gpu")
MODEL_KEYS = {
    "layers",
    "hidden",
    "heads",
    "ffn_hidden",
    "seq_len",
    "vocab",
    "experts",
    "top_k",
    "expert_ffn_hidden",
    "shared_experts",
    "dense_layers",
    "gated_mlp",
}
MODEL_REQUIRED = ("layers", "hidden", "heads", "ffn_hidden", "seq_len", "vocab")
#: The MoE keys: 0 (their default) in a dense model.
MOE_KEYS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "dense_layers")
PARALLEL_KEYS = {"tp", "pp", "dp", "ep"}
PARALLEL_REQUIRED = ("tp", "pp", "dp")
BATCH_KEYS = {"micro_batch", "global_batch"}
GPU_KEYS = {"peak_flops", "efficiency"}
AUTO = "auto"
#: Bytes per element of activations and gradients.
PRECISIONS = {"bf16": 2, "fp16": 2, "fp32": 4}
DEFAULT_PRECISION = "bf16"
#: PyTorch DDP's ``bucket_cap_mb=25`` (torch.nn.parallel.DistributedDataParallel, which
#: multiplies it by 1024 * 1024): gradients are all-reduced in buckets of this many bytes.
DEFAULT_BUCKET = 25 * 2**20

#: A FLOP/s figure: a number with an optional decimal SI prefix (989T = 989e12 FLOP/s).
FLOPS = re.compile(
    r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([KMGTPE]?)(?:FLOP/?S)?\s*$", re.IGNORECASE
)
_FLOPS_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_FLOPS_FORMS = "a FLOP/s figure such as 989T, 1.98P or 9.89e14"
#: A GPU's dense matrix FLOP/s: 1T is far below any training GPU's (a 2017 V100: 125T),
#: 100P far above any (an H100/H800: 989T BF16, a B200: 2.25P). Outside it the figure is a
#: unit mistake (``989`` for 989T), whose compute a replay would sleep for years.
PEAK_FLOPS_RANGE = (1e12, 1e17)


def parse_flops(text: object) -> float:
    """FLOP/s for ``989T``, ``1.98P``, ``9.89e14`` (a number or its text); ValueError naming
    the accepted forms for anything else, or for a figure that is not positive."""
    if isinstance(text, bool):
        raise ValueError(_FLOPS_FORMS)
    if isinstance(text, (int, float)):
        value = float(text)
    elif isinstance(text, str) and (match := FLOPS.match(text)):
        value = float(match.group(1)) * _FLOPS_PREFIX[match.group(2).upper()]
    else:
        raise ValueError(_FLOPS_FORMS)
    if not value > 0 or value == float("inf"):
        raise ValueError("a positive FLOP/s figure")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: ``layers`` blocks of attention and MLP.

    An MoE model (``experts`` > 0) replaces the MLP of every layer from ``dense_layers`` on
    with ``experts`` routed experts of width ``expert_ffn_hidden``, of which each token
    visits ``top_k``, plus ``shared_experts`` every token visits (DeepSeekMoE). A gated MLP
    (SwiGLU, as DeepSeek-V3 and LLaMA use) has three weight matrices of h x f instead of the
    two of GPT's GeLU MLP, hence 1.5 times the parameters and FLOPs.
    """

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    seq_len: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    gated_mlp: bool = False

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Layer ``layer`` (0-based, of the whole model) holds routed experts."""
        return self.moe and layer >= self.dense_layers

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of h x f in one MLP (or one expert): 3 gated, 2 otherwise."""
        return 3 if self.gated_mlp else 2


@dataclass(frozen=True)
class ParallelSpec:
    """Tensor, pipeline and data parallel degrees; ``ep`` expert-parallel ranks spread the
    routed experts over the data-parallel dimension (so ``ep`` divides ``dp``)."""

    tp: int
    pp: int
    dp: int
    ep: int = 1


@dataclass(frozen=True)
class BatchSpec:
    micro_batch: int  # sequences per micro-batch
    global_batch: int  # sequences per iteration, over all data-parallel ranks


@dataclass(frozen=True)
class GpuSpec:
    peak_flops: float  # FLOP/s, bf16 dense
    efficiency: float  # the share of it matrix work achieves (0 < efficiency <= 1)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    model: ModelSpec
    parallel: ParallelSpec
    batch: BatchSpec
    gpu: GpuSpec
    description: str = ""
    source: str = ""  # citations for the figures
    dtype_bytes: int = PRECISIONS[DEFAULT_PRECISION]
    bucket_bytes: int = DEFAULT_BUCKET
    recompute: bool = False  # full activation recomputation: one more forward per backward

    @property
    def gpus(self) -> int:
        return self.parallel.tp * self.parallel.pp * self.parallel.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches each data-parallel rank runs through the pipeline per iteration."""
        return self.batch.global_batch // (self.batch.micro_batch * self.parallel.dp)

    def layers_of(self, stage: int) -> range:
        """The layers (0-based, of the whole model) pipeline stage ``stage`` holds."""
        if not 0 <= stage < self.parallel.pp:
            raise ValueError(f"stage {stage} is not one of {self.parallel.pp} stages")
        per = self.model.layers // self.parallel.pp
        return range(stage * per, (stage + 1) * per)


class _WorkloadReader(_Reader):
    """The fabric spec's document walker, raising WorkloadError."""

    error = WorkloadError

    def positive(self, raw: Mapping[str, Any], section: str, key: str, default: int = -1) -> int:
        """``raw[key]`` as an integer >= 1 (or ``default`` when absent and given)."""
        if key not in raw and default >= 0:
            return default
        return self.integer(raw[key], f"{section}.{key}", 1)

    def required(self, raw: Mapping[str, Any], section: str, keys: tuple[str, ...]) -> None:
        for key in keys:
            if key not in raw:
                path = f"{section}.{key}" if section else key
                self.fail(path, "this key to be present", "it missing")


#: What a parsed workload must meet before anything is built from it, checked with the
#: cost model's knowledge (gradient bytes per stage, compute seconds): orchestrator/workload/
#: costs.py registers its checks here, since it imports this module and this one cannot
#: import it; the package's __init__ imports costs, so they are registered whenever this
#: module is. Each gets the reader (to fail naming a key), the spec, the document and the
#: emulation scale (None: not known yet).
Limit = Callable[["_WorkloadReader", "WorkloadSpec", Mapping[str, Any], "float | None"], None]
LIMITS: list[Limit] = []


def parse_workload(
    document: object,
    source: str = "<inline>",
    *,
    gpus: int | None = None,
    gpus_per_server: int | None = None,
    scale: float | None = None,
) -> WorkloadSpec:
    """Validate a parsed YAML document into a WorkloadSpec (see the module docstring).

    ``gpus``: the fabric's GPU count, which the layout must fill (and ``dp: auto`` needs);
    ``gpus_per_server``: the GPUs one NVLink domain holds, which ``tp`` must divide;
    ``scale``: the emulation scale its compute is stretched by (1 / scale), whose longest
    step must stay one a replay can sleep (:func:`orchestrator.workload.costs.check_compute`).
    """
    read = _WorkloadReader(source)
    doc = read.mapping(document, "", TOP_KEYS)
    read.required(doc, "", REQUIRED_KEYS)
    name = doc["name"]
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        read.fail("name", NAME_TEXT, name)
    texts = {}
    for key in ("description", "source"):
        texts[key] = doc.get(key, "")
        if not isinstance(texts[key], str):
            read.fail(key, "a text", _describe(texts[key]))

    model = _model(read, doc["model"])
    parallel = _parallel(read, doc["parallel"], model, gpus, gpus_per_server)
    batch = _batch(read, doc["batch"], parallel)
    raw_gpu = read.mapping(doc["gpu"], "gpu", GPU_KEYS)
    read.required(raw_gpu, "gpu", tuple(sorted(GPU_KEYS)))
    peak = read.parsed(raw_gpu["peak_flops"], "gpu.peak_flops", parse_flops)
    if not PEAK_FLOPS_RANGE[0] <= peak <= PEAK_FLOPS_RANGE[1]:
        read.fail(
            "gpu.peak_flops",
            "one GPU's dense FLOP/s, between 1T and 100P",
            raw_gpu["peak_flops"],
            detail="an H100's BF16 is 989T; a figure outside is a unit mistake",
        )
    efficiency = read.number(raw_gpu["efficiency"], "gpu.efficiency", 0.0, 1.0)
    if efficiency <= 0:
        read.fail("gpu.efficiency", "a number above 0 and at most 1", efficiency)
    precision = read.choice(
        doc.get("precision", DEFAULT_PRECISION), "precision", list(PRECISIONS), "a precision"
    )
    bucket = read.parsed(doc.get("bucket", DEFAULT_BUCKET), "bucket", parse_size)
    recompute = read.boolean(doc.get("recompute", False), "recompute")
    spec = WorkloadSpec(
        name=name,
        model=model,
        parallel=parallel,
        batch=batch,
        gpu=GpuSpec(peak, efficiency),
        description=texts["description"],
        source=texts["source"],
        dtype_bytes=PRECISIONS[precision],
        bucket_bytes=bucket,
        recompute=recompute,
    )
    for check in LIMITS:
        check(read, spec, doc, scale)
    return spec


PRESETS_DIR = REPO / "workloads"  # the shipped workloads, named by their file's stem


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_workload(value: str, base_dir: Path | None = None) -> Path:
    """The workload file ``value`` names: a shipped preset's (``deepseek-like``), or a
    path (a relative one starts at ``base_dir``, default the working directory). An
    unknown preset name is a WorkloadError naming the presets."""
    if is_preset_name(value):
        path = PRESETS_DIR / f"{value}.yaml"
        if not path.is_file():
            raise WorkloadError(
                None, "", "a workload file or a preset: " + ", ".join(presets()), value
            )
        return path
    path = Path(value).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return path


def load_workload(
    path: str | Path,
    *,
    gpus: int | None = None,
    gpus_per_server: int | None = None,
    scale: float | None = None,
) -> WorkloadSpec:
    """Read and validate a workload file; every problem becomes one WorkloadError."""
    path = Path(path)
    document = read_yaml(path, WorkloadError, "workload")
    return parse_workload(
        document, str(path), gpus=gpus, gpus_per_server=gpus_per_server, scale=scale
    )


def _model(read: _WorkloadReader, value: object) -> ModelSpec:
    raw = read.mapping(value, "model", MODEL_KEYS)
    read.required(raw, "model", MODEL_REQUIRED)
    sizes = {key: read.positive(raw, "model", key) for key in MODEL_REQUIRED}
    moe = {key: read.integer(raw.get(key, 0), f"model.{key}", 0) for key in MOE_KEYS}
    gated = read.boolean(raw.get("gated_mlp", False), "model.gated_mlp")
    model = ModelSpec(**sizes, **moe, gated_mlp=gated)
    if model.hidden % model.heads:
        read.fail(
            "model.hidden",
            f"a multiple of model.heads ({model.heads})",
            model.hidden,
            detail="each head takes hidden / heads of the hidden dimension",
        )
    if not model.moe:
        extra = [key for key in MOE_KEYS if moe[key]]
        if extra:
            read.fail(f"model.{extra[0]}", "0 in a dense model (model.experts: 0)", moe[extra[0]])
        return model
    for key in ("top_k", "expert_ffn_hidden"):
        if moe[key] < 1:
            read.fail(f"model.{key}", "an integer >= 1 in an MoE model", moe[key])
    if model.top_k > model.experts:
        read.fail("model.top_k", f"at most model.experts ({model.experts})", model.top_k)
    if model.dense_layers >= model.layers:
        read.fail(
            "model.dense_layers",
            f"fewer than model.layers ({model.layers}): an MoE model has an MoE layer",
            model.dense_layers,
        )
    return model


def _parallel(
    read: _WorkloadReader,
    value: object,
    model: ModelSpec,
    gpus: int | None,
    gpus_per_server: int | None,
) -> ParallelSpec:
    raw = read.mapping(value, "parallel", PARALLEL_KEYS)
    read.required(raw, "parallel", PARALLEL_REQUIRED)
    tp = read.positive(raw, "parallel", "tp")
    pp = read.positive(raw, "parallel", "pp")
    ep = read.positive(raw, "parallel", "ep", default=1)
    if raw["dp"] == AUTO:
        if gpus is None:
            read.fail("parallel.dp", "an integer >= 1 (auto needs the GPU count given)", AUTO)
        assert gpus is not None
        if gpus % (tp * pp):
            read.fail(
                "parallel.dp",
                f"auto: the GPUs ({gpus}) a multiple of tp x pp ({tp} x {pp})",
                AUTO,
            )
        dp = gpus // (tp * pp)
    else:
        dp = read.positive(raw, "parallel", "dp")
    if model.heads % tp:
        read.fail("parallel.tp", f"a divisor of model.heads ({model.heads})", tp)
    if gpus_per_server is not None and gpus_per_server % tp:
        read.fail(
            "parallel.tp",
            f"a divisor of the GPUs per server ({gpus_per_server})",
            tp,
            detail="tensor parallelism stays on a server's NVLink",
        )
    if model.layers % pp:
        read.fail("parallel.pp", f"a divisor of model.layers ({model.layers})", pp)
    if ep > 1 and not model.moe:
        read.fail("parallel.ep", "1 in a dense model (no experts to spread)", ep)
    if model.moe and model.experts % ep:
        read.fail("parallel.ep", f"a divisor of model.experts ({model.experts})", ep)
    if dp % ep:
        read.fail("parallel.ep", f"a divisor of parallel.dp ({dp})", ep)
    if gpus is not None and tp * pp * dp != gpus:
        read.fail(
            "parallel",
            f"tp x pp x dp = the fabric's {gpus} GPUs",
            f"{tp} x {pp} x {dp} = {tp * pp * dp}",
        )
    return ParallelSpec(tp=tp, pp=pp, dp=dp, ep=ep)


def _batch(read: _WorkloadReader, value: object, parallel: ParallelSpec) -> BatchSpec:
    raw = read.mapping(value, "batch", BATCH_KEYS)
    read.required(raw, "batch", ("micro_batch", "global_batch"))
    micro = read.positive(raw, "batch", "micro_batch")
    total = read.positive(raw, "batch", "global_batch")
    if total % (micro * parallel.dp):
        read.fail(
            "batch.global_batch",
            f"a multiple of batch.micro_batch x parallel.dp ({micro} x {parallel.dp}): "
            "whole micro-batches on every data-parallel rank",
            total,
        )
    return BatchSpec(micro_batch=micro, global_batch=total)
