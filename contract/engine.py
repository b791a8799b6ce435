"""Every knob of the engine, in one flat dataclass, with the one set of defaults: the engine's as a library
(``LLM(...)``) and the worker's (``core/settings.py`` makes each field a ``PAGEDQ_*`` setting of the same
name and default)."""

from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m-instruct"  # the built-in model (worker/engine/default_model.py)
DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"  # the built-in embedding model (worker/engine/minilm.py)
# An embedding step's token budget when none is given (LLM(kind="embed")): no stream waits on an embedding
# step. all-MiniLM-L6-v2 on 300 of bench/embeddings.py's texts (10-250 tokens), 2 threads, rounds
# alternated on a shared 2-core box, with the encoder attention kernel: 2048 18.9 texts/s, 4096 22.1,
# 8192 23.1, 16384 23.9; 8192 (its widest activation about 50 MB).
EMBED_MAX_NUM_BATCHED_TOKENS = 8192
GPU_STEP_TOKENS = 2048  # a generation step's token budget on a GPU, when none is given
CPU_STEP_TOKENS = 512  # and on the CPU
# On the CPU a prefill chunk's token also costs its attention over the context before the chunk: the
# scheduler counts it 1 + context / CPU_CONTEXT_KEYS against the budget, so a step deep in a long prompt
# takes about as long as one at its start. Fitted on the default model's 512-token steps through a
# 7,000-token prompt (step time ~ 1 + context / 2,600; a loaded 2-core box, rough). A GPU counts tokens only.
CPU_CONTEXT_KEYS = 2500


GGUF_MAGIC, GGUF_VERSIONS = b"GGUF", (2, 3)  # a GGUF file's first 4 bytes, and the versions pagedq reads


def is_gguf_header(head: bytes) -> bool:
    """Whether ``head`` (a file's first 8 bytes) starts a GGUF file of a version pagedq reads."""
    return len(head) >= 8 and head[:4] == GGUF_MAGIC and int.from_bytes(head[4:8], "little") in GGUF_VERSIONS


def is_gguf_source(model: str) -> bool:
    """Whether ``model`` names a ``.gguf`` file (served as it is: worker/engine/gguf_source.py)."""
    return model.strip().lower().endswith(".gguf")


def default_quantization(model: str) -> str:
    """What ``model`` runs with when no quantization is asked: a ``.gguf`` file's weights in their own
    types, anything else in float."""
    return "gguf" if is_gguf_source(model) else "none"


@dataclass
class EngineConfig:
    model: str = DEFAULT_MODEL
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # fp16: CPU linears on float16 weights (worker/engine/model/cpu_linears.py): about twice as fast a
    # decode step, within about 2e-4 of float32 but not token for token. gguf: the weights of the model's
    # .gguf file kept in their block formats, run by the CPU's quantized kernels (worker/engine/model/
    # gguf_loader.py). float32 weights stay the default.
    quantization: str = "none"  # none | fp16 | gguf
    # How quantization="gguf" multiplies: float (weights de-quantized in registers, float32 activations:
    # float32's tokens on the same weights) or int8 (activations quantized per 32 values, llama.cpp's
    # integer dot products; logprobs move by up to ~0.35 nats). Both keep a row's result independent of its
    # batch. bench/gguf_speed.py compares them: int8 is the faster on AVX2 and AVX-512 VNNI alike
    # (docs/architecture.md has the numbers), float the default for its fidelity.
    gguf_kernel: str = "float"  # float | int8
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    block_size: int = 16
    # Seats are cheap: a waiting or short sequence holds only the KV blocks it fills, and a full pool
    # preempts. 256 (vLLM's default, the benchmarks' setting) lets the KV pool, not the seat count,
    # bound a GPU's batch; a worker also holds this many jobs at once.
    max_num_seqs: int = 256
    # Tokens per step: a prompt's prefill is chunked to this, and every running decode waits for the
    # step. None: by device (step_budget). On a GPU 2048 (vLLM's for its online server; 4096 and 8192
    # measured no faster); on the CPU a 2048-token step of the default model took ~2.7 s, which every
    # running stream waited for, so the CPU's is smaller (bench/prefill_itl.py, bench/RESULTS.md).
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # defaults to the model's context length
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None  # CPU KV budget; None picks a share of RAM
    load_format: str = "safetensors"  # safetensors | dummy (random weights of the model's shapes: benchmarks)
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps (CPU always runs eagerly)
    seed: int = 0  # the random weights' seed under load_format="dummy"
    # A request's tokens do not depend on what shares its steps (batch, chunks, prefix hits, preemption):
    # CPU float32 linears and attention run row by row in fixed-order kernels (worker/engine/model/
    # cpu_linears.py). Decode steps cost about the same, long prefills more (bench/reproducibility.py).
    # Not on GPU, nor with quantization="fp16".
    batch_invariant: bool = True
    # A structured-output constraint still compiling after this many seconds fails its request only.
    grammar_compile_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.load_format not in ("safetensors", "dummy"):
            raise ValueError(f"load_format must be 'safetensors' or 'dummy', got {self.load_format!r}")
        if self.quantization not in ("none", "fp16", "gguf"):
            raise ValueError(f"quantization must be 'none', 'fp16' or 'gguf', got {self.quantization!r}")
        if self.gguf_kernel not in ("float", "int8"):
            raise ValueError(f"gguf_kernel must be 'float' or 'int8', got {self.gguf_kernel!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")

    def step_budget(self, on_gpu: bool) -> int:
        """A generation step's token budget: the one given, else the device's default."""
        return self.max_num_batched_tokens or (GPU_STEP_TOKENS if on_gpu else CPU_STEP_TOKENS)

    def step_context_keys(self, on_gpu: bool) -> int | None:
        """The context at which a prefill token counts twice against the step budget (None: never)."""
        return None if on_gpu else CPU_CONTEXT_KEYS
