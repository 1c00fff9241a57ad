"""The prompt layout, as Alpamayo-R1 lays it out (chat template, images, ego history, CoC, future).

Two layouts share this contract, chosen by the tokenizer (`tok.layout`):
  "specdrive"  specdrive's layout below, over the closed word vocabulary (prompt/vocab.py,
               checkpoints/tiny was trained on it) or specdrive's BPE (prompt/bpe.py);
  "alpamayo"   Alpamayo-R1's own chat template over a Hugging Face tokenizer
               (prompt/hf_tokenizer.py), built by `alpamayo_prompt` below.
`tok.conditioning` (Conditioning) says how the action expert is conditioned in that layout.

    <|im_start|> user
      (<|vision_start|> <|image_pad|> x n_i <|vision_end|>)   for each camera image
      <|traj_history_start|> 48 history tokens <|traj_history_end|>
    <|im_end|> <|im_start|> assistant <|cot_start|>          <- inference prompt ends here
      CoC tokens <|cot_end|>
      <|traj_future_start|> 128 future tokens <|traj_future_end|> <|im_end|>   (token-output mode)

`ids[:reasoning_start]` is what the planner prefills; training sees the whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from core.config import check_choice, check_range
from prompt.trajectory import (DT, V0_ESTIMATORS, future_tokens, history_tokens, v0_backward_difference,
                               v0_least_squares)

SEG_TEXT, SEG_VISION, SEG_HISTORY, SEG_COC, SEG_FUTURE = 0, 1, 2, 3, 4
ROUTINE, COMMITMENT = 1, 2  # values of Prompt.coc_kind for CoC tokens (0 elsewhere)


EXPERT_ROWS = ("cot_end", "traj_future_start")


@dataclass(frozen=True)
class Conditioning:
    """How the action expert is conditioned, a property of a checkpoint's layout: the last cache
    row it reads (<|cot_end|>, or one row more, <|traj_future_start|>, as upstream Alpamayo-R1
    runs it) and the estimator of its initial speed v0 (prompt.trajectory.V0_ESTIMATORS)."""
    through: str = "cot_end"
    v0: str = "backward_difference"
    v_lambda: float = 1e-6      # least_squares only: upstream's v_lambda / v_ridge defaults
    v_ridge: float = 1e-4

    def __post_init__(self):
        check_choice("conditioning.through", self.through, EXPERT_ROWS)
        check_choice("conditioning.v0", self.v0, V0_ESTIMATORS)
        check_range("conditioning.v_lambda", self.v_lambda, lo=0.0)
        check_range("conditioning.v_ridge", self.v_ridge, lo=0.0)

    def tail(self, tok) -> list[int]:
        """Token ids after <|cot_end|> that the expert's cache rows hold."""
        return [] if self.through == "cot_end" else [tok.traj_future_start]

    def speed(self, history) -> float:
        """v0 (m/s) of (16, 3) poses by this layout's estimator."""
        if self.v0 == "least_squares":
            return v0_least_squares(history, DT, self.v_lambda, self.v_ridge)
        return v0_backward_difference(history)


@dataclass
class Prompt:
    ids: np.ndarray            # (T,) int64 token ids
    segment: np.ndarray        # (T,) int8, SEG_*
    coc_kind: np.ndarray       # (T,) int8, ROUTINE / COMMITMENT for CoC words, else 0
    image_spans: list = field(default_factory=list)  # [(start, n_tokens)] per image
    reasoning_start: int = 0   # index just after <|cot_start|>

    def __len__(self) -> int:
        return len(self.ids)


class _Builder:
    def __init__(self):
        self.ids, self.seg, self.kind = [], [], []

    def add(self, ids, seg, kind=None):
        ids = [int(i) for i in ids]
        self.ids += ids
        self.seg += [seg] * len(ids)
        self.kind += list(kind) if kind is not None else [0] * len(ids)


def build_prompt(tok, image_tokens, history, coc: str | None = None, future=None,
                 coc_routine=None) -> Prompt:
    """Token sequence of one scene.

    image_tokens: vision tokens per image after the 2x2 merge (e.g. [24] * 8);
    history: (16, 3) ego poses; coc: CoC words (training) or None (inference);
    future: (64, 2|3) waypoints for token-output training, or None;
    coc_routine: per CoC word (coc.split(" ")), True when routine (follows from the history);
    with a subword tokenizer every token of a word gets that word's flag (Prompt.coc_kind).
    """
    if tok.layout == "alpamayo":
        if coc is not None or future is not None:
            raise ValueError("the Alpamayo-R1 layout builds inference prompts only (no CoC, no future)")
        return alpamayo_prompt(tok, image_tokens, history)
    subword = getattr(tok, "subword", False)     # prompt.bpe.BpeTokenizer: a word may be several tokens
    word = (lambda w: tok.encode(w)) if subword else (lambda w: [tok.id(w)])   # noqa: E731
    b = _Builder()
    b.add([tok.im_start, *word("user")], SEG_TEXT)
    spans = []
    for n in image_tokens:
        b.add([tok.vision_start], SEG_TEXT)
        spans.append((len(b.ids), int(n)))
        b.add([tok.image_pad] * int(n), SEG_VISION)
        b.add([tok.vision_end], SEG_TEXT)
    b.add([tok.traj_history_start], SEG_TEXT)
    b.add(history_tokens(tok, history), SEG_HISTORY)
    b.add([tok.traj_history_end, tok.im_end, tok.im_start, *word("assistant"), tok.cot_start], SEG_TEXT)
    reasoning_start = len(b.ids)
    if coc is not None:
        ids = tok.encode(coc)
        n_words = len(coc.split(" ")) if subword else len(ids)
        if coc_routine is not None and len(coc_routine) != n_words:
            raise ValueError(f"coc_routine has {len(coc_routine)} flags for {n_words} CoC words")
        kind = None
        if coc_routine is not None:
            flags = [ROUTINE if r else COMMITMENT for r in coc_routine]
            # subword: each token takes its word's flag (a word split in several tokens gives each one)
            kind = [flags[w] for w in tok.word_index(ids)] if subword else flags
        b.add(ids, SEG_COC, kind)
        b.add([tok.cot_end], SEG_TEXT)
        if future is not None:
            b.add([tok.traj_future_start], SEG_TEXT)
            b.add(future_tokens(tok, future), SEG_FUTURE)
            b.add([tok.traj_future_end, tok.im_end], SEG_TEXT)
    elif future is not None:
        raise ValueError("a future needs the CoC before it (the layout is CoC, then trajectory)")
    return Prompt(np.array(b.ids, dtype=np.int64), np.array(b.seg, dtype=np.int8),
                  np.array(b.kind, dtype=np.int8), spans, reasoning_start)


# --- Alpamayo-R1's layout ------------------------------------------------------------------------
# Upstream NVlabs/alpamayo @ 1cba38c, src/alpamayo_r1/helper.py create_message: a system message,
# a user message of the images (cameras x frames, camera-major: image_frames.flatten(0, 1)) then
# one text (the history placeholders + an instruction), and an assistant message "<|cot_start|>";
# rendered by Qwen3-VL's chat template with continue_final_message=True (the prompt ends right
# after <|cot_start|>, no <|im_end|>); the processor expands each <|image_pad|> into the image's
# merged-token count; models/base_model.py fuse_traj_tokens then writes the history token ids
# (DeltaTrajectoryTokenizer bins + hist_token_start_idx) into the <|traj_history|> slots in order.
ALPAMAYO_SYSTEM = "You are a driving assistant that generates safe and accurate actions."
ALPAMAYO_INSTRUCTION = ("output the chain-of-thought reasoning of the driving process, "
                        "then output the future trajectory.")


def alpamayo_text(image_tokens, n_history: int) -> str:
    """The rendered chat text with the image pads expanded, before tokenization."""
    images = "".join("<|vision_start|>" + "<|image_pad|>" * int(n) + "<|vision_end|>" for n in image_tokens)
    history = "<|traj_history_start|>" + "<|traj_history|>" * n_history + "<|traj_history_end|>"
    return (f"<|im_start|>system\n{ALPAMAYO_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{images}{history}{ALPAMAYO_INSTRUCTION}<|im_end|>\n"
            "<|im_start|>assistant\n<|cot_start|>")


def alpamayo_prompt(tok, image_tokens, history) -> Prompt:
    """Inference prompt of one scene in Alpamayo-R1's layout (tok: a HF AlpamayoTokenizer)."""
    hist = tok.history_tokens(history)
    ids = np.asarray(tok.encode(alpamayo_text(image_tokens, len(hist))), np.int64)
    slots = ids == tok.traj_history
    if int(slots.sum()) != len(hist):
        raise ValueError(f"{int(slots.sum())} <|traj_history|> slots for {len(hist)} history tokens")
    ids[slots] = hist
    segment = np.full(len(ids), SEG_TEXT, np.int8)
    segment[ids == tok.image_pad], segment[slots] = SEG_VISION, SEG_HISTORY
    starts = np.flatnonzero(np.diff(np.concatenate([[0], (ids == tok.image_pad).astype(np.int8)])) == 1)
    spans = [(int(s), int(n)) for s, n in zip(starts, image_tokens)]
    return Prompt(ids, segment, np.zeros(len(ids), np.int8), spans, len(ids))
