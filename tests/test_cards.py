"""Each artifact card is declared once, in core/artifacts.py: a writer builds the card (`new`) and
writes it (`write`), a reader parses the same card. Parsing a card's JSON gives the card back,
and a card rebuilt from its parts writes the bytes its file holds (the shipped checkpoint's
meta.json included: its fingerprint must not move)."""
import json
import shutil
from pathlib import Path

from core.artifacts import META, CheckpointMeta, EngineFile, EnginesMeta, Manifest, TrtllmMeta, read_engines_meta, \
    read_manifest, read_meta
from core.config import read_json
from tests.fake_engines import TRT, build_fake_engines

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny"
CHECKPOINT_PARTS = ("format", "format_version", "kind", "config_class", "config", "dtype", "modules")


def written(card, folder: Path) -> bytes:
    return card.write(folder).read_bytes()


def test_each_shipped_checkpoint_card_rebuilt_from_its_parts_writes_its_bytes(tmp_path):
    folders = sorted(f.parent for f in SHIPPED.glob(f"*/{META}"))
    assert len(folders) >= 4
    for folder in folders:
        card = read_meta(folder)
        raw = json.loads((folder / META).read_text())
        extra = {k: v for k, v in raw.items() if k not in CHECKPOINT_PARTS}
        again = CheckpointMeta.new(folder, card.kind, card.config_class, card.config, card.dtype, card.modules, extra)
        assert again == card and CheckpointMeta.from_dict(card.to_dict(), folder) == card
        out = tmp_path / folder.name
        out.mkdir()
        assert written(again, out) == (folder / META).read_bytes(), folder.name


def test_an_export_card_round_trips_and_rebuilds_to_its_file(tiny_onnx):
    card = read_engines_meta(tiny_onnx)
    assert EnginesMeta.from_dict(card.to_dict(), tiny_onnx) == card
    raw = card.to_dict()
    again = EnginesMeta.new(
        tiny_onnx, max_len=card.max_len, k_max=card.k_max, draft=card.draft, draft_features=card.draft_features,
        draft_rope=card.draft_rope, feature_layers=raw["feature_layers"], tokenizer_sha256=card.tokenizer_sha256,
        prompt=card.prompt, vision=card.vision, target=card.target, draft_llm=card.draft_llm, action=card.action,
        graphs=card.graphs, draft_vocab=card.draft_vocab, source=card.source, model_config=raw["model_config"],
        torch=raw["torch"], created_at=raw["created_at"])
    assert again == card and again.to_dict() == raw
    assert json.dumps(raw, indent=2, sort_keys=True) + "\n" == (tiny_onnx / META).read_text()
    assert Path(card.source.checkpoint) == SHIPPED and "target" in card.source.models


def test_a_built_manifest_round_trips(tiny_onnx, tmp_path):
    folder = tmp_path / "eng"
    shutil.copytree(tiny_onnx, folder)
    returned = build_fake_engines(folder)
    card = read_manifest(folder, backend="tensorrt")
    assert card.to_dict() == returned and Manifest.from_dict(card.to_dict(), folder) == card
    assert card.built and set(card.engines) == set(card.graphs)
    assert all(isinstance(e, EngineFile) and e.tensorrt == TRT for e in card.engines.values())
    assert card.onnx_meta_sha256 is not None and card.needs == {}


def test_a_trtllm_card_round_trips(tmp_path):
    card = TrtllmMeta.new(tmp_path, role="draft", files={"config.json": "a" * 64}, release="1.0.0rc4", source="ck",
                          source_sha256={"draft": "b" * 64}, cannot_build_at_release=["mrope"],
                          draft_vocab=(256, "c" * 64))
    card.write(tmp_path)
    back = TrtllmMeta.from_dict(read_json(tmp_path / META, "card"), tmp_path)
    assert back == card and back.to_dict() == card.to_dict()
    assert back.draft_vocab["n"] == 256 and back.calibration is None and back.cannot_build_at_release == ["mrope"]
