"""The small Qwen-style targets the model tests share: special ids and tiny_cfg."""
from models.config import LLMConfig, TargetConfig, VisionConfig

IMG, VS, VE, V = 60, 61, 62, 64


def tiny_cfg(style: str) -> TargetConfig:
    """2-layer, hidden-64 target; Qwen3 (q/k norm, interleaved, DeepStack) or Qwen2.5 style
    (qkv bias, sectioned M-RoPE, window attention)."""
    q3 = style == "qwen3"
    vision = VisionConfig(style=style, depth=2, hidden=32, heads=2, intermediate=48, patch=4,
                          num_position_embeddings=16, deepstack_layers=(0, 1) if q3 else (),
                          window_size=0 if q3 else 16, fullatt_blocks=() if q3 else (1,))
    llm = LLMConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                    vocab_size=V, mrope_section=(4, 2, 2) if q3 else (2, 3, 3),
                    interleaved=q3, qk_norm=q3, qkv_bias=not q3)
    return TargetConfig(vision=vision, llm=llm, image_token_id=IMG, vision_start_id=VS)
