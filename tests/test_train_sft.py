"""Target SFT: the data pipeline (patches as HF lays them out, masks, positions), the losses
(trajectory tokens masked while reasoning, the expert reads only the rows before its cut) and a
few-step smoke training on real scenes whose losses go down."""
import numpy as np
import pytest
import torch

from prompt.layout import SEG_COC
from train import data, sft
from train.config import RunConfig, SFTConfig
from train.vocab import build_tokenizer
from train_inputs import examples, micro_preset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = build_tokenizer()
    cfg, target, expert = sft.build_models(micro_preset(tmp_path_factory.mktemp("p")), tok, seed=0)
    exs = examples(4, tok, cfg.target.vision)
    sft.set_action_normalization(expert, exs)
    return tok, cfg, target, expert, exs


def test_patchify_matches_the_hf_qwen_vl_processor():
    transformers = pytest.importorskip("transformers")
    proc = transformers.Qwen2VLImageProcessor(
        patch_size=8, merge_size=2, temporal_patch_size=2, do_resize=False,
        image_mean=[0.5] * 3, image_std=[0.5] * 3, rescale_factor=1 / 255)
    imgs = np.random.default_rng(0).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)
    ref = proc(images=list(imgs), return_tensors="np")
    pixels, grid = data.patchify(imgs, patch=8, temporal_patch=2, merge=2)
    assert (grid == ref["image_grid_thw"]).all()
    err = np.abs(pixels - ref["pixel_values"]).max()
    assert err < 1e-5, f"patch layout differs from HF: max diff {err}"


def test_masks_cover_the_coc_and_the_future(setup):
    tok, cfg, target, expert, exs = setup
    ex = exs[0]
    coc, fut = data.loss_masks(ex)
    targets = ex.ids[1:][coc[:-1]]
    assert targets[-1] == tok.cot_end and len(targets) == len(ex.coc_kind.nonzero()[0]) + 1
    assert set(ex.ids[1:][fut[:-1]][1:129]) <= set(tok.fut_x_ids) | set(tok.fut_y_ids)
    assert not (coc & fut).any()
    assert ex.ids[ex.reasoning_start - 1] == tok.cot_start


def test_trajectory_logits_do_not_touch_the_reasoning_loss(setup):
    tok, cfg, target, expert, exs = setup
    batch = data.collate(exs[:2], tok.pad, cfg.target.vision)
    traj = torch.from_numpy(tok.traj_mask())
    logits = torch.randn(*batch.ids.shape, len(tok))
    base = sft.token_losses(logits, batch, traj)
    boosted = logits.clone()
    boosted[..., traj] += 50.0
    out = sft.token_losses(boosted, batch, traj)
    assert torch.allclose(out["coc"], base["coc"]), "trajectory logits leaked into the CoC loss"
    assert not torch.allclose(out["future"], base["future"]), "the future loss must see trajectory logits"


def test_expert_cuts_stay_in_the_reasoning_and_read_no_later_row(setup):
    tok, cfg, target, expert, exs = setup
    batch = data.collate(exs, tok.pad, cfg.target.vision)
    lens = sft.expert_cache_lengths(batch, cuts=3, seed=0, step=5)
    assert (lens[0] == batch.cot_end + 1).all()
    assert ((lens[1:] >= batch.reasoning_start) & (lens[1:] <= batch.cot_end)).all()
    llm = cfg.target.llm
    B, T = batch.ids.shape
    kv = torch.randn(llm.layers, 2, B, llm.kv_heads, T, llm.head_dim)
    a = sft.expert_loss(expert, kv, lens[1], batch, 0, 0, salt=0)
    kv2 = kv.clone()
    for b in range(B):
        kv2[:, :, b, :, int(lens[1, b]):] = 1e3       # rows at and after the cut
    assert torch.equal(a, sft.expert_loss(expert, kv2, lens[1], batch, 0, 0, salt=0))
    kv2[:, :, :, :, 0] += 1.0
    assert not torch.equal(a, sft.expert_loss(expert, kv2, lens[1], batch, 0, 0, salt=0))


def test_few_step_sft_lowers_every_loss(setup):
    tok, cfg, target, expert, exs = setup
    scfg = SFTConfig(run=RunConfig(out="unused", batch_size=4), expert_cuts=1)
    traj = torch.from_numpy(tok.traj_mask())
    batch = data.collate(exs, tok.pad, cfg.target.vision)
    params = list(target.parameters()) + list(expert.parameters())
    opt = torch.optim.AdamW(params, lr=5e-3)

    def losses():   # the same 4 draws of flow noise, time and cut before and after
        with torch.no_grad():
            logs = [sft.sft_step(target, expert, batch, scfg, traj, step=1000 + s)[1] for s in range(4)]
        return {k: sum(r[k] for r in logs) / 4 for k in ("coc", "future", "expert", "expert_cut")}

    before = losses()
    for step in range(20):
        loss, _ = sft.sft_step(target, expert, batch, scfg, traj, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = losses()
    for name in ("coc", "future", "expert", "expert_cut"):
        assert after[name] < before[name], f"{name}: {before[name]:.3f} -> {after[name]:.3f}"
    assert after["coc"] < 0.7 * before["coc"]


def test_micro_preset_loads(tmp_path):
    from models.config import load_preset

    cfg = load_preset(micro_preset(tmp_path))
    assert cfg.target.llm.layers == 4 and cfg.expert.head_dim == cfg.target.llm.head_dim
