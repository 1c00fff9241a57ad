"""The routine reasoner: a 1-2 layer draft decoder with FlatRoPE that shares the target's token
embedding and LM head and, EAGLE-3 style, reads the target's low/mid/top hidden states.

    draft = Draft(cfg, target.embed_tokens, target.lm_head)   cfg: models.config.ModelConfig
    cache = draft.new_cache(batch, max_len)       (draft_layers, 2, B, kv_heads, max_len, D)
    cos, sin = draft.rope(position_ids)           (B, T) flat ids, or (3, B, T) if rope="mrope"
    logits, hidden = draft(ids, cos, sin, cache, start, features, image_embeds)

Inputs per row j (cache row start + j):
    x_j = embed(ids_j)   (image-pad rows: the target's image embedding, as in the target)
    f_j = fc([h_low, h_mid, h_top])  when `features` is (B, T, 3D): target hidden states
        = features                   when `features` is (B, T, D): the draft's own `hidden`
    first layer input = in_proj([x_j, f_j]);  features="none": the first layer input is x_j
    arch="eagle3": the input is [x_j, f_j] (B, T, 2D) and the one layer is EAGLE-3's midlayer
    (models/eagle3.py: q/k/v over the normed pair, the residual on f_j)
Output: logits (B, T, V) = lm_head(norm(hidden)), hidden (B, T, D) the last layer's residual.

Reduced head (cfg.draft.vocab = N > 0, EAGLE-3 / FR-Spec): the draft has its own head
vocab_head (N, D) over N target tokens and the buffer d2t (N,) int64, draft id i -> target id
d2t[i] (saved with the draft's weights). `head` gives the N logits of the draft's own head;
`forward` scatters them to the target vocabulary, -inf outside the head, so q = softmax is
exactly zero there and every caller (backends, export, sampling) sees target ids and (B, T, V).
`forward(..., head_only=True)` returns the (B, T, N) head logits (the map then is the caller's).

Alignment (EAGLE): row j holds token ids_j and the feature of the state *before* it, i.e. the
target's hidden states at position j - 1 (the state whose logits produced ids_j); row j
predicts ids_{j+1}. `shift_features` builds that from target hiddens: out[:, j] = feats[:, j-1],
out[:, 0] = 0. After prefill over the prompt (rows 0..T-1), the target's next token x_T goes
in row T with the target feature of position T-1; each further drafted token d goes in the
next row with the draft's own `hidden` of the row that predicted d (the target has not seen d
yet). After verification the caller rewrites the accepted rows from `start` with the target's
features; stale rows past the accepted length are never read (rollback = a smaller `start`).

Shared weights: embedding and head are the target's objects, kept out of the module tree, so
the draft's state_dict and parameters() hold only its own weights (nothing stored twice; the
shared ones stay frozen with the target).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from models.config import ModelConfig
from models.eagle3 import Eagle3Layer
from models.layers import DecoderBlock, RMSNorm, cache_rows, image_mask, inference_plan, new_kv_cache
from models.rope import rope_cos_sin


class Draft(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        self.cfg, self.llm = cfg.draft, cfg.draft_llm()
        D = self.llm.hidden
        for name, m in (("embedding", embed_tokens), ("LM head", lm_head)):
            if tuple(m.weight.shape) != (self.llm.vocab_size, D):
                raise ValueError(f"shared {name} weight shape {tuple(m.weight.shape)}: expected "
                                 f"(vocab_size={self.llm.vocab_size}, hidden={D})")
        self._shared = (embed_tokens, lm_head)    # a tuple: not registered, not in state_dict
        self.image_token_id = cfg.target.image_token_id
        self.eagle3 = self.cfg.arch == "eagle3"
        if self.cfg.features == "fused":
            self.fc = nn.Linear(len(self.cfg.feature_layers) * D, D, bias=False)
            if not self.eagle3:
                self.in_proj = nn.Linear(2 * D, D, bias=False)
        block = Eagle3Layer if self.eagle3 else DecoderBlock
        self.layers = nn.ModuleList(block(self.llm) for _ in range(self.llm.layers))
        self.norm = RMSNorm(D, self.llm.norm_eps)
        if self.cfg.vocab:
            self.vocab_head = nn.Linear(D, self.cfg.vocab, bias=False)
            self.register_buffer("d2t", torch.arange(self.cfg.vocab))      # (N,) draft id -> target id
        self.apply(_init_weights)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._shared[0]

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    def frozen_copy(self) -> "Draft":
        """A frozen copy of the draft's own weights (eval mode) that shares the target's
        embedding and LM head objects (e.g. the fixed reference of AARL's KL anchor)."""
        other = copy.deepcopy(self, memo={id(m): m for m in self._shared})
        for p in other.parameters():
            p.requires_grad_(False)
        return other.eval()

    def set_vocab(self, d2t) -> None:
        """Set the reduced head's map d2t (N,) target ids and start its rows as the target head's
        rows d2t (the initialisation that distillation then trains)."""
        d2t = torch.as_tensor(d2t, dtype=torch.long, device=self.norm.weight.device)
        if not self.cfg.vocab or tuple(d2t.shape) != (self.cfg.vocab,):
            raise ValueError(f"d2t of shape {tuple(d2t.shape)}: this draft has a head of "
                             f"{self.cfg.vocab or 'the target'}'s rows (draft.vocab={self.cfg.vocab})")
        with torch.no_grad():
            self.d2t.copy_(d2t)
            self.vocab_head.weight.copy_(self.lm_head.weight[d2t])

    def to_target(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits (..., N) -> target-vocabulary logits (..., V), -inf outside the head
        (a full head: unchanged)."""
        if not self.cfg.vocab:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.llm.vocab_size), float("-inf"))
        return full.index_copy(-1, self.d2t, logits)

    def rope(self, position_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) flat ids (or (3, B, T) M-RoPE ids for rope="mrope") -> cos, sin (B, T, head_dim)."""
        llm = self.llm
        pos = torch.as_tensor(position_ids, device=self.norm.weight.device)
        if llm.mrope_section == () and pos.dim() != 2:
            raise ValueError(f"FlatRoPE draft takes (B, T) position ids, got shape {tuple(pos.shape)}")
        return rope_cos_sin(pos, llm.head_dim, llm.rope_theta, llm.mrope_section, llm.interleaved)

    def new_cache(self, batch: int, max_len: int, dtype=None, device=None) -> torch.Tensor:
        w, llm = self.norm.weight, self.llm
        return new_kv_cache(llm.layers, batch, llm.kv_heads, max_len, llm.head_dim,
                            dtype or w.dtype, device or w.device)

    def forward(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: torch.Tensor | None = None, start=0,
                features: torch.Tensor | None = None, image_embeds: torch.Tensor | None = None,
                head_only: bool = False, tree=None, kv_len: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, T), cos/sin (B, T, head_dim), cache (layers, 2, B, KVH, max_len, hd) or None
        (then causal over the T rows), features (B, T, 3D) | (B, T, D) | None (features="none")
        -> logits (B, T, V) (head_only: the head's own (B, T, N)), hidden (B, T, D). The cache
        contract is the target's: rows start..start+T-1 written by index, attention over all
        max_len rows under a mask; `tree` (T, max_len) bool replaces that causal mask (a token
        tree's nodes: each sees the prefix and its ancestors, wherever their rows are). kv_len:
        the inference path over cache rows 0 .. kv_len-1 (Target.forward's)."""
        x = self.inputs(ids, features, image_embeds)
        rows, mask = (None, None) if cache is None else \
            cache_rows(start, ids.shape[1], cache[0][0].shape[-2], ids.device)
        if tree is not None:
            if cache is None:
                raise ValueError("a tree mask needs a cache")
            mask = tree
        plan = None if kv_len is None else inference_plan(self.llm, cache, start, ids.shape[1], kv_len,
                                                           mask, cos, sin, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], rows, mask, plan)
        logits = self.head(x, fast=plan is not None)
        return (logits if head_only else self.to_target(logits)), x

    def inputs(self, ids: torch.Tensor, features: torch.Tensor | None,
               image_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The first layer's input (B, T, D): in_proj([embed(ids), fc(features)]) for a fused
        draft, embed(ids) for a standalone one (image-pad rows: the target's image embeddings);
        (B, T, 2D) [embed(ids), fc(features)] for an EAGLE-3 draft (its midlayer norms each half)."""
        x = self.embed_tokens(ids)
        if image_embeds is not None:
            mask = image_mask(ids, self.image_token_id, image_embeds.shape[0])
            x = x.masked_scatter(mask, image_embeds.to(x.dtype))
        if self.cfg.features == "fused":
            x2 = torch.cat([x, self._fuse(features, ids.shape)], dim=-1)
            return x2 if self.eagle3 else self.in_proj(x2)
        if features is not None:
            raise ValueError("this draft has features='none' (standalone); pass features=None")
        return x

    def head(self, hidden: torch.Tensor, fast: bool = False) -> torch.Tensor:
        """Last layer's residual (B, T, D) -> logits (B, T, V) through the target's head, or
        (B, T, N) through the draft's own reduced head (map them with `to_target` / d2t); fast:
        the final norm in one op (the inference path's)."""
        head = self.vocab_head if self.cfg.vocab else self.lm_head
        return head(self.norm.fast(hidden) if fast else self.norm(hidden))

    def _fuse(self, features: torch.Tensor | None, shape) -> torch.Tensor:
        D, n = self.llm.hidden, len(self.cfg.feature_layers)
        if features is None or tuple(features.shape[:2]) != tuple(shape) or \
                features.shape[-1] not in (n * D, D):
            got = None if features is None else tuple(features.shape)
            raise ValueError(f"features {got}: expected (B, T, {n * D}) target hiddens "
                             f"(layers {list(self.cfg.feature_layers)}) or (B, T, {D}) draft "
                             f"hiddens, with (B, T) = {tuple(shape)}")
        return self.fc(features) if features.shape[-1] == n * D else features


def target_features(hiddens: list[torch.Tensor]) -> torch.Tensor:
    """Target.forward's hiddens for draft.cfg.feature_layers (low, mid, top) -> (B, T, 3D)."""
    return torch.cat(hiddens, dim=-1)


def shift_features(feats: torch.Tensor) -> torch.Tensor:
    """(B, T, F) target features by position -> draft rows: out[:, j] = feats[:, j-1], row 0 = 0."""
    return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)


def _init_weights(module: nn.Module, std: float = 0.02) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
