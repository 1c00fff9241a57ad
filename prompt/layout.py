"""The prompt layout, as Alpamayo-R1 lays it out (chat template, images, ego history, CoC, future).

    <|im_start|> user
      (<|vision_start|> <|image_pad|> x n_i <|vision_end|>)   for each camera image
      <|traj_history_start|> 48 history tokens <|traj_history_end|>
    <|im_end|> <|im_start|> assistant <|cot_start|>          <- inference prompt ends here
      CoC words <|cot_end|>
      <|traj_future_start|> 128 future tokens <|traj_future_end|> <|im_end|>   (token-output mode)

`ids[:reasoning_start]` is what the planner prefills; training sees the whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prompt.trajectory import future_tokens, history_tokens

SEG_TEXT, SEG_VISION, SEG_HISTORY, SEG_COC, SEG_FUTURE = 0, 1, 2, 3, 4
ROUTINE, COMMITMENT = 1, 2  # values of Prompt.coc_kind for CoC word tokens (0 elsewhere)


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
    coc_routine: per CoC word, True when routine (follows from the history).
    """
    b = _Builder()
    b.add([tok.im_start, tok.id("user")], SEG_TEXT)
    spans = []
    for n in image_tokens:
        b.add([tok.vision_start], SEG_TEXT)
        spans.append((len(b.ids), int(n)))
        b.add([tok.image_pad] * int(n), SEG_VISION)
        b.add([tok.vision_end], SEG_TEXT)
    b.add([tok.traj_history_start], SEG_TEXT)
    b.add(history_tokens(tok, history), SEG_HISTORY)
    b.add([tok.traj_history_end, tok.im_end, tok.im_start, tok.id("assistant"), tok.cot_start], SEG_TEXT)
    reasoning_start = len(b.ids)
    if coc is not None:
        words = tok.encode(coc)
        if coc_routine is not None and len(coc_routine) != len(words):
            raise ValueError(f"coc_routine has {len(coc_routine)} flags for {len(words)} CoC words")
        kind = [ROUTINE if r else COMMITMENT for r in coc_routine] if coc_routine is not None else None
        b.add(words, SEG_COC, kind)
        b.add([tok.cot_end], SEG_TEXT)
        if future is not None:
            b.add([tok.traj_future_start], SEG_TEXT)
            b.add(future_tokens(tok, future), SEG_FUTURE)
            b.add([tok.traj_future_end, tok.im_end], SEG_TEXT)
    elif future is not None:
        raise ValueError("a future needs the CoC before it (the layout is CoC, then trajectory)")
    return Prompt(np.array(b.ids, dtype=np.int64), np.array(b.seg, dtype=np.int8),
                  np.array(b.kind, dtype=np.int8), spans, reasoning_start)
