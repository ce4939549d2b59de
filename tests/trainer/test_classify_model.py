"""The sequence classifier against transformers' ``*ForSequenceClassification`` (FP32 logits of
padded rows, relative 1e-4) for the four decoders, our export loaded by
``AutoModelForSequenceClassification``, the PEFT ``SEQ_CLS`` adapter loaded by PEFT, and the
losses by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import hf_tiny
import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import (
    AutoModelForSequenceClassification,
    LlamaForSequenceClassification,
    MistralForSequenceClassification,
    Qwen2ForSequenceClassification,
    Qwen3ForSequenceClassification,
)

from trainer import hf, hf_config, lora
from trainer.classify import export
from trainer.classify.load import load_classifier
from trainer.classify.model import (
    HeadSpec,
    SequenceClassifier,
    auto_class_weights,
    from_causal_lm,
    last_token,
    loss_sum,
    normalizer,
)

SEQ = 12
PAD = 3
NAMES = ("alpha", "beta", "gamma")
CLASSES: dict[str, Any] = {
    "llama": LlamaForSequenceClassification,
    "qwen2": Qwen2ForSequenceClassification,
    "qwen3": Qwen3ForSequenceClassification,
    "mistral": MistralForSequenceClassification,
}
OVERRIDES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 12},
    "mistral": {"sliding_window": None},
}


def _rows() -> torch.Tensor:
    """Three rows padded on the right to different lengths, one of them full, pad-free."""
    tokens = torch.randint(4, 256, (3, SEQ), generator=torch.Generator().manual_seed(2))
    tokens[0, 5:] = PAD
    tokens[1, 9:] = PAD
    return tokens


def _theirs(arch: str, seed: int = 0) -> Any:
    config_class, _ = hf_tiny.CLASSES[arch]
    config = config_class(
        **{**hf_tiny.SHAPE, **OVERRIDES[arch]},
        num_labels=len(NAMES),
        id2label=dict(enumerate(NAMES)),
        label2id={n: i for i, n in enumerate(NAMES)},
        pad_token_id=PAD,
    )
    torch.manual_seed(seed)
    model = CLASSES[arch](config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _their_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=tokens, attention_mask=(tokens != PAD).long()).logits
    return logits


def test_last_token_is_transformers_rule() -> None:
    tokens = torch.tensor([[5, 6, PAD, PAD], [5, 6, 7, 8], [PAD, PAD, PAD, PAD], [5, PAD, 6, PAD]])
    assert last_token(tokens, PAD).tolist() == [1, 3, 0, 2]


@pytest.mark.parametrize("arch", list(CLASSES))
def test_logits_match_transformers_both_ways(arch: str, tmp_path: Path) -> None:
    theirs = _theirs(arch)
    theirs.save_pretrained(tmp_path / "theirs")
    tokens = _rows()
    ours = load_classifier(tmp_path / "theirs", seq_len=SEQ).eval()
    assert ours.spec == HeadSpec(NAMES, False, PAD)
    with torch.no_grad():
        our_logits = ours.scores(tokens)
    expected = _their_logits(theirs, tokens)
    torch.testing.assert_close(
        our_logits, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max())
    )

    raw = json.loads((tmp_path / "theirs" / hf_config.CONFIG).read_text())
    export.save_classifier(ours.state_dict(), raw, ours.spec, tmp_path / "ours", dtype="float32")
    back = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    assert back.config.id2label == dict(enumerate(NAMES))
    assert back.config.label2id == {n: i for i, n in enumerate(NAMES)}
    torch.testing.assert_close(
        _their_logits(back, tokens), our_logits, rtol=1e-4, atol=1e-4 * float(expected.abs().max())
    )


def test_new_head_on_a_causal_lm_keeps_the_decoder(tmp_path: Path) -> None:
    source = hf_tiny.model_dir(tmp_path, "qwen2", tie_word_embeddings=True)
    cfg = hf_config.model_config(source, seq_len=SEQ)
    torch.manual_seed(0)
    model = from_causal_lm(source, cfg, HeadSpec(NAMES, False, PAD))
    decoder = hf.load_pretrained(source, cfg)
    assert torch.equal(model.tok.weight, decoder.tok.weight)
    assert model.head.weight.shape == (len(NAMES), cfg.d_model)
    assert model.head.weight is not model.tok.weight
    with torch.no_grad():
        assert torch.equal(model.hidden(_rows()), decoder.hidden(_rows()))


def test_lora_adapter_loads_in_peft_with_its_score_head(tmp_path: Path) -> None:
    base = _theirs("llama")
    base.save_pretrained(tmp_path / "base")
    raw = json.loads((tmp_path / "base" / hf_config.CONFIG).read_text())
    model = load_classifier(tmp_path / "base", seq_len=SEQ)
    spec = lora.LoraSpec(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "down_proj"))
    lora.apply(model, model.cfg, spec)
    model.head.weight.requires_grad_(True)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    assert "head.weight" in state
    written = export.save_adapter(
        state, raw, spec, model.spec, tmp_path / "adapter", base_model=str(tmp_path / "base")
    )
    config = json.loads((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())
    assert config["task_type"] == "SEQ_CLS"
    assert config["modules_to_save"] == ["score"]
    assert sorted(written) == sorted([lora.ADAPTER_WEIGHTS, lora.ADAPTER_CONFIG])

    fresh = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    peft = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    tokens = _rows()
    with torch.no_grad():
        ours = model.eval().scores(tokens)
    theirs = _their_logits(peft, tokens)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4 * float(ours.abs().max()))


def test_merged_lora_export_loads_as_a_plain_classifier(tmp_path: Path) -> None:
    base = _theirs("qwen3")
    base.save_pretrained(tmp_path / "base")
    raw = json.loads((tmp_path / "base" / hf_config.CONFIG).read_text())
    model = load_classifier(tmp_path / "base", seq_len=SEQ)
    spec = lora.LoraSpec(rank=2, alpha=2.0)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    lora.apply(model, model.cfg, spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.add_(torch.randn_like(p) * 0.05)
    merged = lora.merged({**full, **model.state_dict()}, model.cfg, spec)
    export.save_classifier(merged, raw, model.spec, tmp_path / "merged")
    back = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        ours = model.eval().scores(_rows())
    torch.testing.assert_close(
        _their_logits(back, _rows()), ours, rtol=1e-4, atol=1e-4 * float(ours.abs().max())
    )


def test_head_and_logits_stay_fp32_under_bf16_autocast(tmp_path: Path) -> None:
    _theirs("llama").save_pretrained(tmp_path / "m")
    model = load_classifier(tmp_path / "m", seq_len=SEQ)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model.scores(_rows())
    assert logits.dtype == torch.float32
    assert model.head.weight.dtype == torch.float32


def test_weighted_cross_entropy_by_hand() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [0.0, 1.0, 3.0], [9.0, 9.0, 9.0]])
    labels = torch.tensor([0, 1, 2, 0])
    rows = torch.tensor([True, True, True, False])
    weights = torch.tensor([1.0, 2.0, 4.0])
    by_hand = 0.0
    for logit, label in zip(logits[:3].tolist(), labels[:3].tolist(), strict=True):
        by_hand += weights[label].item() * -(
            logit[label] - math.log(sum(math.exp(v) for v in logit))
        )
    total = loss_sum(logits, labels, rows, multi_label=False, class_weights=weights)
    assert total.item() == pytest.approx(by_hand, rel=1e-6)
    denominator = normalizer(
        labels.numpy(), rows.numpy(), multi_label=False, class_weights=weights.numpy()
    )
    assert denominator == 1.0 + 2.0 + 4.0
    reference = torch.nn.functional.cross_entropy(logits[:3], labels[:3], weight=weights)
    assert (total / denominator).item() == pytest.approx(reference.item(), rel=1e-6)
    unweighted = loss_sum(logits, labels, rows, multi_label=False)
    assert unweighted.item() != pytest.approx(total.item())


def test_multi_label_loss_is_bce_with_pos_weight() -> None:
    logits = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [5.0, 5.0, 5.0]])
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    rows = torch.tensor([True, True, False])
    pos = torch.tensor([2.0, 1.0, 3.0])
    total = loss_sum(logits, labels, rows, multi_label=True, class_weights=pos)
    reference = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[:2], labels[:2], pos_weight=pos
    )
    assert normalizer(labels.numpy(), rows.numpy(), multi_label=True) == 2.0
    assert (total / 2).item() == pytest.approx(reference.item(), rel=1e-6)


def test_auto_class_weights_are_inverse_frequency() -> None:
    single = np.array([0, 0, 0, 1, 2, 2], dtype=np.int32)
    assert auto_class_weights(single, 4).tolist() == pytest.approx(
        [6 / (4 * 3), 6 / (4 * 1), 6 / (4 * 2), 1.0]
    )
    multi = np.array([[1, 0], [1, 1], [1, 0], [0, 0]], dtype=np.uint8)
    assert auto_class_weights(multi, 2).tolist() == pytest.approx([1 / 3, 3.0])


def test_classifier_loss_needs_a_real_row() -> None:
    model = SequenceClassifier(
        hf_config.parse_config(
            json.loads(json.dumps({"architectures": ["LlamaForCausalLM"], **hf_tiny.SHAPE})),
            seq_len=SEQ,
        ),
        HeadSpec(NAMES, False, PAD),
    )
    rows = torch.zeros(3, dtype=torch.bool)
    loss = model(_rows(), torch.zeros(3, dtype=torch.int64), rows)
    assert loss.item() == 0.0


def test_a_steps_loss_is_the_weighted_mean_however_micro_batches_split_it(tmp_path: Path) -> None:
    from test_classify_data import documents, write_jsonl

    from trainer import data, device, parallel
    from trainer.classify import data as cdata
    from trainer.classify.task import Classify

    tokenizer = hf_tiny.save_tokenizer(tmp_path / "tok")
    records = documents(13, seed=4, skew=(5, 2, 1))
    cdata.prepare(
        tmp_path / "ds", tokenizer, write_jsonl(tmp_path / "in.jsonl", records), eval_fraction=0.0
    )
    ds, labels = data.open_dataset(tmp_path / "ds"), cdata.open_labels(tmp_path / "ds")
    weights = auto_class_weights(labels.train, labels.num_labels)
    cfg = hf_config.parse_config(
        {"architectures": ["LlamaForCausalLM"], **hf_tiny.SHAPE}, seq_len=SEQ
    )
    torch.manual_seed(0)
    model = SequenceClassifier(cfg, HeadSpec(labels.names, False, 1), torch.from_numpy(weights))
    backend = device.resolve("cpu", compile_backend="none").start()
    steps = []
    for micro_batch, accum in ((8, 1), (2, 4), (3, 3)):
        sampler = cdata.ClassifySampler(
            ds,
            labels.train,
            pad_token_id=1,
            seq_len=SEQ,
            micro_batch=micro_batch,
            grad_accum=accum,
            seed=9,
        )
        task = Classify(sampler, None, labels, weights, parallel.Ranks(), backend)
        weight = task.step_weight(0)
        with torch.no_grad():
            steps.append(
                sum(float(task.loss(model, task.batch(0, m), weight)) for m in range(accum))
            )
    # The first 8 (or 9) examples of the seed's order: the same examples for 8 rows and 2 x 4.
    order = cdata.ClassifySampler(
        ds, labels.train, pad_token_id=1, seq_len=SEQ, micro_batch=8, seed=9
    )
    x, y, _ = order.batch(0)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(
            model.scores(x), y, weight=torch.from_numpy(weights)
        )
    assert steps[0] == pytest.approx(float(expected), rel=1e-5)
    assert steps[1] == pytest.approx(float(expected), rel=1e-5)
    assert steps[2] != pytest.approx(float(expected), rel=1e-5)  # 9 rows: another example too


BERT_SHAPE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}


def _bert(seed: int = 0, **extra: Any) -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        **BERT_SHAPE,
        id2label=dict(enumerate(NAMES)),
        label2id={n: i for i, n in enumerate(NAMES)},
        pad_token_id=PAD,
        **extra,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def test_bert_logits_match_transformers_both_ways(tmp_path: Path) -> None:
    theirs = _bert()
    theirs.save_pretrained(tmp_path / "theirs")
    tokens = _rows()
    tokens[:, 0] = 2  # a [CLS]-like first token
    ours = load_classifier(tmp_path / "theirs", seq_len=SEQ).eval()
    with torch.no_grad():
        our_logits = ours.scores(tokens)
    expected = _their_logits(theirs, tokens)
    scale = float(expected.abs().max())
    torch.testing.assert_close(our_logits, expected, rtol=1e-4, atol=1e-4 * scale)
    raw = json.loads((tmp_path / "theirs" / hf_config.CONFIG).read_text())
    export.save_classifier(ours.state_dict(), raw, ours.spec, tmp_path / "ours")
    back = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    assert back.config.id2label == dict(enumerate(NAMES))
    torch.testing.assert_close(
        _their_logits(back, tokens), our_logits, rtol=1e-4, atol=1e-4 * scale
    )


def test_bert_attention_is_bidirectional_and_ignores_padding(tmp_path: Path) -> None:
    _bert().save_pretrained(tmp_path / "m")
    model = load_classifier(tmp_path / "m", seq_len=SEQ).eval()
    tokens = _rows()[:1]
    later = tokens.clone()
    later[0, 3] = 200  # a token after [CLS]: the pooled first position sees it
    unpadded = tokens[:, :5]  # the row's tokens without its padding (positions 5 on)
    with torch.no_grad():
        base, changed, alone = (model.scores(t) for t in (tokens, later, unpadded))
    assert not torch.allclose(base, changed)
    torch.testing.assert_close(alone, base)


def test_bert_encoder_of_a_masked_lm_gets_a_new_head(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForMaskedLM

    from trainer.classify import encoder

    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(**BERT_SHAPE, pad_token_id=PAD)).save_pretrained(tmp_path / "mlm")
    head = HeadSpec(NAMES, True, PAD)
    model = encoder.load(tmp_path / "mlm", seq_len=SEQ, head=head)
    assert model.spec == head and model.classifier.weight.shape == (3, 32)
    with torch.no_grad():
        assert model.scores(_rows()).shape == (3, 3)


def test_bert_with_legacy_layer_norm_names_loads_as_transformers_loads_it(tmp_path: Path) -> None:
    """A checkpoint whose LayerNorms are named ``gamma``/``beta`` (as Google's bert-base-*
    safetensors on the Hub): transformers renames them on load, and so do we."""
    from safetensors.torch import load_file, save_file

    _bert().save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / hf.SINGLE
    state = load_file(str(weights))
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in state.items()
    }
    assert renamed.keys() != state.keys()
    save_file(renamed, str(weights), metadata={"format": "pt"})
    tokens = _rows()
    tokens[:, 0] = 2
    ours = load_classifier(tmp_path / "m", seq_len=SEQ).eval()
    theirs = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        expected = _their_logits(theirs, tokens)
        got = ours.scores(tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_a_bert_export_says_its_dtype_under_both_names(tmp_path: Path) -> None:
    """A checkpoint whose config.json has transformers 4.x's ``torch_dtype`` exported in
    another dtype: both names say the exported one (older readers take ``torch_dtype``)."""
    _bert().save_pretrained(tmp_path / "m")
    raw = json.loads((tmp_path / "m" / hf_config.CONFIG).read_text())
    raw["torch_dtype"] = "float32"
    ours = load_classifier(tmp_path / "m", seq_len=SEQ)
    export.save_classifier(ours.state_dict(), raw, ours.spec, tmp_path / "out", dtype="bfloat16")
    config = json.loads((tmp_path / "out" / hf_config.CONFIG).read_text())
    assert (config["dtype"], config["torch_dtype"]) == ("bfloat16", "bfloat16")


def test_a_bert_without_a_classifier_is_not_loaded_as_one(tmp_path: Path) -> None:
    """A masked LM whose config names classes (as some fine-tuned checkpoints' do) is refused by
    eval and predict's loader instead of scoring with a classifier drawn at random."""
    from transformers import BertConfig, BertForMaskedLM

    labels = {"id2label": dict(enumerate(NAMES)), "label2id": {n: i for i, n in enumerate(NAMES)}}
    config = BertConfig(**BERT_SHAPE, pad_token_id=PAD, **labels)
    BertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    with pytest.raises(hf.HFWeightsError, match="holds no classifier weights"):
        load_classifier(tmp_path / "mlm", seq_len=SEQ)
