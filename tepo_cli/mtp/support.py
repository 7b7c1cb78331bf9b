"""Which models can carry MPO's MTP modules, told from the model type and, once loaded, its
backbone's parts (modules.py builds each depth from them)."""

from __future__ import annotations

from transformers import PreTrainedModel

# Decoder-only models whose layers take (hidden, attention mask, position embeddings) and whose
# backbone exposes embed_tokens, layers, norm and rotary_emb, as Llama's does.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_BACKBONE_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def mtp_support_problem(model_type: str | None, lm: PreTrainedModel | None = None) -> str | None:
    """Why this model cannot carry MTP modules, or None when it can."""
    if model_type not in SUPPORTED:
        return (
            f"its architecture is '{model_type}', and tepo builds MTP modules for Llama-style "
            f"decoders only: {', '.join(SUPPORTED)} (SmolLM2, Llama 3, Mistral, Qwen2/2.5, Qwen3)"
        )
    if lm is not None:
        backbone = lm.base_model
        missing = [part for part in _BACKBONE_PARTS if not hasattr(backbone, part)]
        if missing or lm.get_output_embeddings() is None:
            parts = ", ".join(missing) or "an output embedding (lm_head)"
            return f"its backbone has no {parts}, which MTP modules are built from"
    return None
