"""The model configuration: the hyper-parameters of Qwen3 and Qwen3-MoE, read from and written to a Hugging Face
config.json (``model_type`` ``qwen3``, or ``qwen3_moe`` when the model has experts)."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")           # the config.json model_type values forge.model implements


def eos_token_ids(eos_token_id: int | list[int] | tuple[int, ...] | None) -> tuple[int, ...]:
    """A Hugging Face config's ``eos_token_id`` (one id, a list of them, or none) as a tuple: the one reading of it,
    for Forge's own configs and transformers' alike."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, int):
        return (eos_token_id,)
    return tuple(eos_token_id)


class ModelConfigError(ValueError):
    """A config.json that describes a model this implementation does not support."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # Rotary scaling beyond the trained window, as config.json's rope_parameters (rope_scaling) give it, less the
    # theta: (("rope_type", "yarn"), ("factor", 4.0), ...); empty for the plain rotary embedding.
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # Multi-token prediction modules (DeepSeek-V3 style), chained: module k predicts token t + 2 + k.
    num_nextn_predict_layers: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str = "float32"
    # Mixture of experts (Qwen3-MoE; none when num_experts is 0). A layer is sparse unless it is in mlp_only_layers
    # or (layer + 1) is not a multiple of decoder_sparse_step; dense layers keep intermediate_size. Qwen3-MoE has
    # no shared expert. The MTP modules' layers are sparse in a model with experts (as DeepSeek-V3's are).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False            # renormalise the chosen experts' probabilities to sum to one
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001     # kept for the config's round trip; the learner's weight is its own

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "max_position_embeddings")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.num_nextn_predict_layers < 0:
            raise ModelConfigError("num_nextn_predict_layers must be >= 0")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ModelConfigError("rope_theta and rms_norm_eps must be positive")
        if self.rope_scaling:
            rope_type = self.rope_type
            if rope_type not in SCALED_ROPE_TYPES:
                raise ModelConfigError(f"rope type {rope_type!r} is not supported (default, or "
                                       f"{', '.join(SCALED_ROPE_TYPES)}: the rotary scalings fixed ahead of the "
                                       "sequence)")
        if self.num_experts:
            self._check_experts()

    def _check_experts(self) -> None:
        if not isinstance(self.num_experts, int) or self.num_experts < 1:
            raise ModelConfigError(f"num_experts must be a positive integer, got {self.num_experts!r}")
        if not isinstance(self.num_experts_per_tok, int) or not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ModelConfigError(f"num_experts_per_tok must be between 1 and num_experts ({self.num_experts}), "
                                   f"got {self.num_experts_per_tok!r}")
        if not isinstance(self.moe_intermediate_size, int) or self.moe_intermediate_size < 1:
            raise ModelConfigError(f"moe_intermediate_size must be a positive integer, got "
                                   f"{self.moe_intermediate_size!r}")
        if not isinstance(self.decoder_sparse_step, int) or self.decoder_sparse_step < 1:
            raise ModelConfigError(f"decoder_sparse_step must be a positive integer, got {self.decoder_sparse_step!r}")
        outside = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if outside:
            raise ModelConfigError(f"mlp_only_layers names layers outside 0..{self.num_hidden_layers - 1}: {outside}")
        if self.num_experts >= 65_535:
            raise ModelConfigError(f"num_experts is {self.num_experts}; routing records hold expert ids below 65,535")

    @property
    def rope_type(self) -> str:
        return str(dict(self.rope_scaling).get("rope_type", "default"))

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """config.json's ``rope_parameters``: the type, the theta and the scaling's own parameters."""
        return {"rope_type": "default", **dict(self.rope_scaling), "rope_theta": self.rope_theta}

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def model_type(self) -> str:
        return "qwen3_moe" if self.is_moe else "qwen3"

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has a mixture of experts; MTP layers (index num_hidden_layers and up) do
        in a model with experts."""
        if not self.is_moe:
            return False
        if layer >= self.num_hidden_layers:
            return True
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        """The main stack's layers with experts, in order: the layers a routing record covers."""
        return tuple(i for i in range(self.num_hidden_layers) if self.is_sparse_layer(i))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return eos_token_ids(self.eos_token_id)

    @property
    def num_layers_with_mtp(self) -> int:
        """Attention layers in the whole network: the main stack followed by the MTP modules' layers."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        model_type = data.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(f"model_type {model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"hidden_act {act!r} is not supported (only 'silu')")
        if data.get("use_sliding_window"):
            raise ModelConfigError("sliding-window attention is not supported")
        if data.get("shared_expert_intermediate_size"):
            raise ModelConfigError("shared experts are not supported (Qwen3-MoE has none)")
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_theta = rope.get("rope_theta", data.get("rope_theta", cls.rope_theta))
        scaling = () if rope_type == "default" else tuple(sorted(
            {**{k: v for k, v in rope.items() if k not in ("type", "rope_theta")}, "rope_type": rope_type}.items()))
        names = {f.name for f in fields(cls)} - {"rope_theta", "rope_scaling"}
        if model_type != "qwen3_moe":
            names -= _MOE_FIELDS
        kwargs = {k: data[k] for k in names if k in data and data[k] is not None}
        if model_type == "qwen3_moe":
            kwargs.setdefault("num_experts", data.get("num_local_experts"))
            kwargs["mlp_only_layers"] = tuple(data.get("mlp_only_layers") or ())
            if not kwargs.get("num_experts"):
                raise ModelConfigError("a qwen3_moe config.json needs num_experts (a positive integer)")
        kwargs.setdefault("num_key_value_heads", data.get("num_attention_heads"))
        if "head_dim" not in kwargs and "hidden_size" in data and "num_attention_heads" in data:
            kwargs["head_dim"] = data["hidden_size"] // data["num_attention_heads"]
        kwargs["num_nextn_predict_layers"] = int(data.get("num_nextn_predict_layers") or 0)
        dtype = data.get("dtype") or data.get("torch_dtype")
        if dtype:
            kwargs["torch_dtype"] = str(dtype).removeprefix("torch.")
        missing = [f.name for f in fields(cls) if f.name not in kwargs and f.default is MISSING]
        if missing:
            raise ModelConfigError(f"config.json lacks required keys: {', '.join(sorted(missing))}")
        try:
            return cls(rope_theta=float(rope_theta), rope_scaling=scaling, **kwargs)
        except TypeError as exc:
            raise ModelConfigError(str(exc)) from exc

    def to_hf_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["rope_scaling"]
        if self.is_moe:
            data["mlp_only_layers"] = list(self.mlp_only_layers)
        else:
            for name in _MOE_FIELDS:
                del data[name]
        data.update(
            architectures=["Qwen3MoeForCausalLM" if self.is_moe else "Qwen3ForCausalLM"],
            model_type=self.model_type,
            hidden_act="silu",
            attention_dropout=0.0,
            use_cache=True,
            use_sliding_window=False,
            rope_parameters=self.rope_parameters,
            **({"rope_scaling": dict(self.rope_scaling)} if self.rope_scaling else {}),   # readers of the older key
            dtype=self.torch_dtype,
        )
        return data

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ModelConfigError(f"no config.json at {path}") from exc
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_hf_dict(data)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n")
        return path


SCALED_ROPE_TYPES = ("linear", "yarn", "llama3")

_MOE_FIELDS = frozenset({"num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                         "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef"})
