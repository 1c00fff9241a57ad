"""Tiny random torch models (hidden 32, 2 layers, vocab 96 unless given) for the backend tests."""
import torch

from models.action_expert import ActionExpert
from models.config import DraftConfig, ExpertConfig, LLMConfig, ModelConfig, TargetConfig, VisionConfig
from models.draft import Draft
from models.target import Target

V = 96


def tiny_config(vocab: int = V) -> ModelConfig:
    vision = VisionConfig(depth=1, hidden=16, heads=2, intermediate=32, num_position_embeddings=16,
                          deepstack_layers=(0,))
    llm = LLMConfig(layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=64,
                    vocab_size=vocab, mrope_section=(4, 2, 2))
    return ModelConfig(target=TargetConfig(vision=vision, llm=llm), draft=DraftConfig(layers=1),
                       expert=ExpertConfig(hidden=32, heads=2, intermediate=32, euler_steps=2))


def build(cfg: ModelConfig, seed: int = 0, std: float | None = None):
    """Random models; `std` redraws every weight matrix N(0, std) (0.2: the context, e.g. the
    images, then steers the output more than the last token does)."""
    torch.manual_seed(seed)
    target = Target(cfg.target)
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    if std is not None:
        with torch.no_grad():
            for p in [*target.parameters(), *draft.parameters()]:
                if p.dim() == 2:
                    p.normal_(0, std)
    return target, ActionExpert(cfg.expert, cfg.target.llm), draft
