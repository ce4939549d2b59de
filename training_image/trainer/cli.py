"""``trn-train``: prepare-data, run, compile, eval, report, and for Hugging Face models score and
export.

Errors: a mistake in the input (a flag, a model or data directory, a checkpoint that does not fit
the run) ends the command with one line on stderr, ``trn-train: error: ...``, and exit status 2,
as ``trnctl`` does; anything else is a bug and keeps its traceback. ``--debug`` shows the
traceback of an input error too.

``compile`` fills the compile cache ahead of a run: the same job for a few steps, without
checkpoints or metrics, after checking that the node's host memory holds the compilers. It runs
where the run will, on the trn nodes: the Neuron documentation reads for this trainer describes
``neuron_parallel_compile`` (the XLA stack) as extracting graphs from a trial run of the
training script, and documents no device-free compile of TorchNeuron training graphs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from trainer.config import (
    ACTIVATION_CHECKPOINTING,
    AUTO_CHECKPOINT_PARAMS,
    CLASS_WEIGHTS,
    DEFAULT_MAX_STEPS,
    PRESETS,
    SHARD_EMBEDDINGS,
    TASKS,
    TrainConfig,
)
from trainer.launch import PRECOMPILE_STEPS

# Host memory one compiling process is assumed to need when neither --compile-memory-gib nor
# TRN_COMPILE_MEMORY_GIB says: a floor chosen for this trainer's presets, not a Neuron figure.
DEFAULT_COMPILE_MEMORY_GIB = 8.0
# The exit status of an input error, as argparse's own usage errors and trnctl's (USAGE).
USAGE = 2


def _positive_gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"--compile-memory-gib must be a number of GiB above 0, got {text!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trn-train", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    _add_prepare_command(sub)
    run = sub.add_parser("run", help="train, resuming from the newest valid checkpoint")
    _add_training_args(run)
    comp = sub.add_parser(
        "compile",
        help=f"fill the compile cache: the run's flags, {PRECOMPILE_STEPS} steps, nothing saved",
    )
    _add_training_args(comp)
    comp.add_argument(
        "--compile-memory-gib",
        type=_positive_gib,
        # A string default goes through type= like a flag, so a bad variable is refused alike.
        default=os.environ.get("TRN_COMPILE_MEMORY_GIB", str(DEFAULT_COMPILE_MEMORY_GIB)),
        help="host memory per compiling process (each rank of the node compiles); default "
        "TRN_COMPILE_MEMORY_GIB or %(default)s",
    )

    _add_eval_command(sub)
    _add_predict_command(sub)
    rep = sub.add_parser("report", help="plot loss and throughput of a metrics file")
    rep.add_argument("metrics")
    rep.add_argument("--out", required=True)
    _add_hf_commands(sub)
    for command in sub.choices.values():
        command.add_argument(
            "--debug",
            action="store_true",
            help="show the traceback of an input error (by default: one line, exit status 2)",
        )
    return p


def _add_prepare_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    prep = sub.add_parser(
        "prepare-data",
        help="tokenize text into shards: a model's tokenizer (--tokenizer), else bytes",
    )
    prep.add_argument("--out", required=True, help="directory for the shards and manifest.json")
    prep.add_argument(
        "--corpus", help="without --tokenizer: directory of .txt files (default: shipped corpus)"
    )
    prep.add_argument("--tokenizer", help="model directory whose tokenizer to use")
    prep.add_argument("--input", help="with --tokenizer: the file to tokenize")
    prep.add_argument(
        "--format",
        choices=["auto", "text", "jsonl", "chat", "classify", "interactions"],
        default="auto",
        help="with --tokenizer: chat (JSON lines of {'messages': [...]}), jsonl (of {'text': "
        "...}), text (the file is one document) or classify (of {'text': ..., 'label': ...} or "
        "{'text': ..., 'labels': [...]}: docs/classification.md); default %(default)s: chat or "
        "jsonl by the first line's fields, else text. Without --tokenizer: interactions "
        "(--input of JSON lines, CSV or Parquet with user_id, item_id, timestamp: "
        "docs/recommendation.md)",
    )
    prep.add_argument(
        "--eval-fraction",
        type=float,
        help="with --tokenizer: share held out for eval loss, default 0.01: of the examples "
        "(jsonl, chat; at least one) or of the tokens (text: the tail)",
    )
    prep.add_argument(
        "--eval-input",
        help="with --format jsonl, chat or classify: a file of held-out examples (instead of "
        "--eval-fraction)",
    )
    prep.add_argument(
        "--seq-len",
        type=int,
        default=0,
        help="the run's sequence length: each split must fill a row of it, and the examples "
        "cut or dropped at it are reported; default: as `run --model` with the tokenizer's "
        "model (2048, capped at max_position_embeddings)",
    )
    prep.add_argument(
        "--shard-tokens",
        type=int,
        help="tokens per shard; default 65536 (bytes), 16M (--tokenizer, interactions)",
    )
    _add_interactions_args(prep)


def _add_interactions_args(prep: argparse.ArgumentParser) -> None:
    """`prepare-data` flags of ``--format interactions``: the feature columns and the history."""
    prep.add_argument(
        "--user-features",
        default="",
        help="with --format interactions: comma list of categorical columns of the user (or "
        "context) tower; default none",
    )
    prep.add_argument(
        "--item-features",
        default="",
        help="with --format interactions: comma list of categorical columns of the item "
        "tower; default none",
    )
    prep.add_argument(
        "--history",
        type=int,
        default=8,
        help="with --format interactions: previous items of the user fed to the user tower; "
        "default %(default)s",
    )


def _add_eval_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ev = sub.add_parser(
        "eval",
        help='loss over every example of a split, once: prints {"loss": L, "tokens": N, '
        '"examples": E}; of classification data {"loss", "accuracy" (multi-label: "micro_f1"), '
        '"macro_f1", "examples"}; of interactions data {"loss", "recall@K", "ndcg@K", "mrr", '
        '"examples"} against every item',
    )
    source = ev.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", dest="model_dir", help="Hugging Face model directory")
    source.add_argument(
        "--checkpoint-dir", help="a run's checkpoints (path or s3:// URI): its newest valid one"
    )
    ev.add_argument("--data", required=True, help="directory made by prepare-data (jsonl, chat)")
    ev.add_argument(
        "--split", choices=["eval", "train", "all"], default="eval", help="default: eval"
    )
    ev.add_argument(
        "--seq-len",
        type=int,
        default=0,
        help="0 = the checkpoint's run's, or with --model as `run --model` takes it",
    )
    ev.add_argument("--micro-batch", type=int, default=8, help="rows per forward; default 8")
    ev.add_argument("--device", choices=["auto", "neuron", "cuda", "cpu", "xla"], default="auto")
    ev.add_argument(
        "--top-k",
        type=int,
        default=10,
        help="of interactions data: the K of recall@K and NDCG@K; default %(default)s",
    )


def _evaluate(args: argparse.Namespace) -> int:
    """``trn-train eval``: the JSON line on stdout, and on stderr what the cutting rule did to
    each split when it cut or dropped an example."""
    from trainer import evaluation
    from trainer.classify import evaluate as classify_eval
    from trainer.recommend import data as rec_data

    if classify_eval.is_classification_data(args.data):
        return _evaluate_classifier(args)
    if rec_data.is_interactions_data(args.data):
        return _evaluate_recommender(args)
    result = evaluation.run(
        data_dir=args.data,
        split=args.split,
        model_dir=args.model_dir or "",
        checkpoint_dir=args.checkpoint_dir or "",
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        device_name=args.device,
    )
    for split, report in result.reports.items():
        if report.cut or report.dropped:
            print(f"eval: {report.line(split)}", file=sys.stderr)
    print(json.dumps(result.as_dict()))
    return 0


def _evaluate_classifier(args: argparse.Namespace) -> int:
    """``trn-train eval`` of classification data: the JSON line of
    :func:`trainer.classify.evaluate.summary`.

    Raises:
        ValueError, trainer.checkpoint.CheckpointError: see
            :func:`trainer.classify.evaluate.run`.
    """
    from trainer.classify import evaluate as classify_eval

    figures = classify_eval.run(
        model_dir=args.model_dir or "",
        checkpoint_dir=args.checkpoint_dir or "",
        data_dir=args.data,
        split=args.split,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        device_name=args.device,
    )
    multi = "exact_match" in figures
    print(json.dumps(classify_eval.summary(figures, multi)))
    return 0


def _evaluate_recommender(args: argparse.Namespace) -> int:
    """``trn-train eval`` of interactions data: the JSON line of
    :func:`trainer.recommend.evaluate.run`.

    Raises:
        ValueError, trainer.checkpoint.CheckpointError: see
            :func:`trainer.recommend.evaluate.run`.
    """
    from trainer.recommend import evaluate as rec_eval

    figures = rec_eval.run(
        model_dir=args.model_dir or "",
        checkpoint_dir=args.checkpoint_dir or "",
        data_dir=args.data,
        split=args.split,
        k=args.top_k,
        micro_batch=args.micro_batch,
        device_name=args.device,
    )
    print(json.dumps(figures))
    return 0


def _add_predict_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pred = sub.add_parser(
        "predict",
        help="a classifier's label and scores for each JSON line of --input (a 'text' field); "
        "an exported two-tower model's top-K items for each (a 'user_id' field)",
    )
    pred.add_argument(
        "--model",
        dest="model_dir",
        required=True,
        help="*ForSequenceClassification directory, or a two-tower export",
    )
    pred.add_argument(
        "--input",
        required=True,
        help="JSON lines with a 'text' field (a classifier), or with 'user_id' and optionally "
        "'history' (item ids, latest first) and the user features (a two-tower model)",
    )
    pred.add_argument("--out", required=True, help="JSON lines: each input line and its prediction")
    pred.add_argument(
        "--seq-len", type=int, default=0, help="tokens kept of each text; 0 = as `run --model`"
    )
    pred.add_argument("--micro-batch", type=int, default=8, help="rows per forward; default 8")
    pred.add_argument("--device", choices=["auto", "neuron", "cuda", "cpu", "xla"], default="auto")
    pred.add_argument(
        "--top-k", type=int, default=10, help="two-tower: items per line; default %(default)s"
    )


def _predict(args: argparse.Namespace) -> int:
    """``trn-train predict``: prints {"out": FILE, "lines": N}."""
    from trainer.classify import evaluate as classify_eval
    from trainer.recommend import evaluate as rec_eval
    from trainer.recommend import export as rec_export

    if rec_export.is_export(args.model_dir):
        count = rec_eval.predict(
            model_dir=args.model_dir, input_path=args.input, out=args.out, k=args.top_k
        )
        print(json.dumps({"out": args.out, "lines": count}))
        return 0
    lines = classify_eval.predict(
        model_dir=args.model_dir,
        input_path=args.input,
        out=args.out,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        device_name=args.device,
    )
    print(json.dumps({"out": args.out, "lines": lines}))
    return 0


def _add_hf_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    score = sub.add_parser(
        "score",
        help="mean next-token cross-entropy (FP32, CPU) of a Hugging Face model on token ids",
    )
    score.add_argument(
        "--model",
        required=True,
        help="Hugging Face model directory, or a PEFT LoRA adapter directory (scored on its base "
        "model: --base-model, default its base_model_name_or_path)",
    )
    score.add_argument("--base-model", help="with an adapter --model: its base model directory")
    score.add_argument(
        "--tokens", required=True, help="JSON file: a list of equal-length lists of token ids"
    )
    export = sub.add_parser(
        "export",
        help="write the newest valid checkpoint of a --model run as a Hugging Face model, or "
        "of a --task recommend run as safetensors towers and item embeddings",
    )
    export.add_argument("--checkpoint-dir", required=True, help="path or s3:// URI")
    export.add_argument("--out", required=True, help="new or empty local directory")
    export.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="of the written weights; auto = the model's config.json dtype (float32 if none)",
    )
    export.add_argument(
        "--best",
        action="store_true",
        help="the run's best checkpoint by its --best-metric instead of the newest",
    )
    export.add_argument(
        "--merge-lora",
        action="store_true",
        help="of a LoRA run: the full model with the adapters merged (default: a PEFT adapter)",
    )
    export.add_argument(
        "--base-model-id",
        default="",
        help="of a LoRA run: the base model's name for the adapter's base_model_name_or_path "
        "(a hub id); default the config's _name_or_path, else the base model's directory",
    )
    export.add_argument(
        "--max-shard-bytes",
        type=int,
        default=5 << 30,
        help="safetensors shard size limit (default 5 GiB)",
    )


def _add_training_args(run: argparse.ArgumentParser) -> None:
    """The flags of `run` and `compile`, defaults from :class:`TrainConfig`."""
    d = TrainConfig()
    for add in (
        _add_model_args,
        _add_task_args,
        _add_recommend_args,
        _add_data_args,
        _add_optimizer_args,
        _add_output_args,
        _add_node_args,
    ):
        add(run, d)


def _add_model_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags: the model (a preset or a Hugging Face directory), LoRA, the
    sequence length and activation checkpointing."""
    run.add_argument("--preset", choices=list(PRESETS), help=f"default: {d.preset}")
    run.add_argument(
        "--model",
        dest="model_dir",
        default=d.model_dir,
        help="Hugging Face model directory to fine-tune (config.json, safetensors, tokenizer); "
        "replaces --preset",
    )
    run.add_argument(
        "--lora-rank",
        type=int,
        default=d.lora_rank,
        help="with --model: train LoRA adapters of this rank (>= 1), the weights frozen",
    )
    run.add_argument(
        "--lora-alpha",
        type=float,
        default=d.lora_alpha,
        help="LoRA scale alpha/rank; default: rank",
    )
    run.add_argument(
        "--lora-targets",
        default=d.lora_targets,
        help="comma list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj "
        "(on BERT: its projections that do the same work, docs/classification.md); default: "
        "all of them",
    )
    run.add_argument(
        "--seq-len",
        type=int,
        default=d.seq_len,
        help="0 = the preset's, or with --model min(2048, max_position_embeddings)",
    )
    run.add_argument(
        "--activation-checkpointing",
        choices=ACTIVATION_CHECKPOINTING,
        default=d.activation_checkpointing,
        help="recompute each transformer block's forward in backward instead of keeping its "
        f"activations; auto (default) = on above {AUTO_CHECKPOINT_PARAMS:.0e} parameters",
    )


def _add_recommend_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags of ``--task recommend``: the model's width and temperature,
    and whether its tables are split across the ranks."""
    run.add_argument(
        "--embedding-dim",
        type=int,
        default=d.embedding_dim,
        help="with --task recommend: width of every table and tower; default %(default)s",
    )
    run.add_argument(
        "--temperature",
        type=float,
        default=d.temperature,
        help="with --task recommend: the softmax temperature of the dot products; default "
        "%(default)s",
    )
    run.add_argument(
        "--shard-embeddings",
        choices=SHARD_EMBEDDINGS,
        default=d.shard_embeddings,
        help="with --task recommend on several ranks: split every embedding table row-wise "
        "across them; auto (default) when the tables' weights, gradients and AdamW state "
        "outgrow one rank's device memory (known from --instance-type)",
    )


def _add_task_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags: the task (next-token prediction or classification), its
    class weights, and the eval figure that picks the best checkpoint."""
    run.add_argument(
        "--task",
        choices=TASKS,
        default=d.task,
        help="causal-lm (default): next-token prediction; classify: a classifier on --model "
        "(a decoder with a score head, or a BERT encoder), data of prepare-data --format "
        "classify (docs/classification.md); recommend: a two-tower retrieval model, data of "
        "prepare-data --format interactions (docs/recommendation.md)",
    )
    run.add_argument(
        "--class-weights",
        choices=CLASS_WEIGHTS,
        default=d.class_weights,
        help="with --task classify: auto weighs each class's loss by inverse frequency "
        "(multi-label: pos_weight negatives/positives); default %(default)s",
    )
    run.add_argument(
        "--best-metric",
        default=d.best_metric,
        help="an eval figure (eval_loss; with --task classify eval_accuracy or, multi-label, "
        "eval_exact_match, eval_macro_f1, eval_micro_f1): each eval that improves it writes a "
        "checkpoint kept beside the newest (export --best); needs --eval-every and "
        "--checkpoint-dir",
    )


def _add_data_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags: the device, the data and the steps over it."""
    run.add_argument("--device", choices=["auto", "neuron", "cuda", "cpu", "xla"], default=d.device)
    run.add_argument(
        "--compile",
        default=d.compile,
        help="torch.compile backend; 'auto' = the device's own, 'none' = eager",
    )
    run.add_argument("--data", required=True)
    run.add_argument(
        "--max-steps",
        type=int,
        default=d.max_steps,
        help=f"optimizer steps; default {DEFAULT_MAX_STEPS} unless --epochs",
    )
    run.add_argument(
        "--epochs",
        type=int,
        default=d.epochs,
        help="with data of examples (--format jsonl or chat): train this many whole epochs, "
        "each example once per epoch, the steps derived from the data; excludes --max-steps",
    )
    run.add_argument("--micro-batch", type=int, default=d.micro_batch, help="per rank; 0 = preset")
    run.add_argument("--grad-accum", type=int, default=d.grad_accum)


def _add_optimizer_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags: the learning rate, weight decay, warm-up and parallelism."""
    run.add_argument(
        "--lr",
        type=float,
        default=d.lr,
        help="peak; 0 = the preset's, with --model 2e-5, with --lora-rank 2e-4",
    )
    run.add_argument(
        "--weight-decay",
        type=float,
        default=d.weight_decay,
        help="AdamW's, on matrices; default 0.1, with --lora-rank 0.0",
    )
    run.add_argument(
        "--warmup-steps",
        type=int,
        default=d.warmup_steps,
        help="-1 = 10%% of max steps, at least 20 and at most 100 (never more than the run)",
    )
    run.add_argument(
        "--parallel", choices=["ddp", "fsdp"], help="with several ranks; default: preset"
    )


def _add_output_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags: checkpoints, metrics and eval."""
    run.add_argument("--checkpoint-dir", default=d.checkpoint_dir, help="path or s3:// URI")
    run.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    run.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    run.add_argument("--metrics", default=d.metrics, help="JSON-lines file (appended)")
    run.add_argument("--log-every", type=int, default=d.log_every)
    run.add_argument(
        "--eval-every",
        type=int,
        default=d.eval_every,
        help="steps between eval losses on the held-out split; 0 (default) = no eval",
    )
    run.add_argument(
        "--eval-batches",
        type=int,
        default=d.eval_batches,
        help="held-out batches per eval of a token stream (--format text); data of examples "
        "evaluates every held-out example",
    )


def _add_node_args(run: argparse.ArgumentParser, d: TrainConfig) -> None:
    """`run` and `compile` flags: the seed, the node and the run's checks."""
    run.add_argument("--seed", type=int, default=d.seed)
    run.add_argument(
        "--instance-type",
        default=d.instance_type,
        help="the node's instance type: the Neuron stack's check and the MFU peak per rank (the "
        "Neuron catalog's, or the GPU catalog's with --device cuda); required on a Neuron "
        "device, where the image's entrypoint passes TRN_INSTANCE_TYPE",
    )
    run.add_argument(
        "--fail-on-recompile",
        action="store_true",
        help="after the first step, a recompile is an error",
    )
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    run.add_argument(
        "--verify-data",
        action="store_true",
        help="re-hash every shard against the manifest (once per node) before training; "
        "by default the manifest, headers and sizes are checked",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``trn-train``; returns the exit status (0 also after a SIGTERM checkpoint;
    :data:`USAGE` after an input error, see :func:`input_error`)."""
    args = _parser().parse_args(argv)
    try:
        return _command(args)
    except Exception as error:
        if args.debug or not input_error(error):
            raise
        print(f"trn-train: error: {one_line(error)}", file=sys.stderr)
        return USAGE


def input_error(error: BaseException) -> bool:
    """Whether ``error`` reports a mistake in the input rather than a bug: every check of flags,
    files and directories raises ``ValueError`` (or a subclass: config, shard, tokenizer and
    resume errors), a checkpoint that cannot be read raises ``CheckpointError``."""
    checkpoint = sys.modules.get("trainer.checkpoint")  # not imported: not one of its errors
    return isinstance(error, ValueError) or (
        checkpoint is not None and isinstance(error, checkpoint.CheckpointError)
    )


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (an embedded library message may hold newlines)."""
    return " ".join(str(error).split())


def _command(args: argparse.Namespace) -> int:
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "prepare-data": _prepare_data,
        "report": _report,
        "compile": _compile,
        "score": _hf_command,
        "export": _hf_command,
        "eval": _evaluate,
        "predict": _predict,
        "run": _run,
    }
    return commands[args.command](args)


def _report(args: argparse.Namespace) -> int:
    from trainer import report

    print(report.plot(args.metrics, args.out))
    return 0


def _run(args: argparse.Namespace) -> int:
    from trainer.loop import train

    result = train(train_config(args))
    print(
        json.dumps(
            {
                "steps_done": result.steps_done,
                "loss": result.last_loss,
                "preempted": result.preempted,
                "checkpoint": result.checkpoint,
            }
        ),
        file=sys.stderr,
    )
    return 0


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of ``run``'s (or ``compile``'s) flags.

    Raises:
        ValueError: both --preset and --model were given.
    """
    cli_only = ("command", "compile_memory_gib", "debug")
    options = {k: v for k, v in vars(args).items() if k not in cli_only}
    if options["preset"] is None:
        options["preset"] = TrainConfig.preset
    elif options["model_dir"]:
        raise ValueError(
            f"--preset {options['preset']} and --model {options['model_dir']} exclude each "
            "other: the model directory's config.json gives the architecture"
        )
    return TrainConfig(**options)


def _hf_command(args: argparse.Namespace) -> int:
    """``score`` prints {"loss": L, "tokens": N} (see :func:`trainer.hf.score`); ``export``
    prints the written directory's files."""
    from trainer import hf_export
    from trainer.classify import export as classify_export
    from trainer.recommend import export as rec_export

    if args.command == "score":
        loss, tokens = _score(args.model, args.tokens, args.base_model)
        print(json.dumps({"loss": loss, "tokens": tokens}))
        return 0
    if rec_export.is_recommend_run(args.checkpoint_dir):
        files = rec_export.export_checkpoint(args.checkpoint_dir, args.out, best=args.best)
        print(json.dumps({"out": args.out, "files": files}))
        return 0
    written = hf_export.export_checkpoint(
        args.checkpoint_dir,
        args.out,
        dtype=args.dtype,
        max_shard_bytes=args.max_shard_bytes,
        merge_lora=args.merge_lora,
        base_model_id=args.base_model_id,
        task_writers={"classify": classify_export.write_checkpoint},
        best=args.best,
    )
    print(json.dumps({"out": args.out, "files": written}))
    return 0


def _score(model: str, tokens: str, base_model: str | None) -> tuple[float, int]:
    """``score``: of a model directory, or of a PEFT adapter directory on its base model.

    Raises:
        ValueError: the adapter's base model is not a local directory, or see
            :func:`trainer.hf.score` and :func:`trainer.lora.read_adapter`.
    """
    from trainer import hf, hf_config, lora

    root = Path(model)
    if (root / hf_config.CONFIG).is_file() or not (root / hf_config.ADAPTER_CONFIG).is_file():
        return hf.score(root, tokens)
    adapter = lora.read_adapter(root)
    base = base_model or adapter.base_model
    if not Path(base).is_dir():
        raise ValueError(
            f"score --model {model} is a PEFT adapter, and its base model {base!r} is not a "
            "directory here: give the base model's directory with --base-model DIR"
        )
    return hf.score(base, tokens, adapt=adapter.apply_to)


def _prepare_data(args: argparse.Namespace) -> int:
    """``trn-train prepare-data``.

    Raises:
        ValueError: flags that do not go together, or bad input (see
            :func:`trainer.tokenizing.prepare`); a corpus directory without ``.txt`` files.
    """
    from trainer import data

    if args.format == "interactions":
        return _prepare_interactions(args)
    if args.tokenizer is None:
        if args.format == "classify":
            raise ValueError("--format classify needs --tokenizer DIR: the model's tokenizer")
        if args.input is not None:
            raise ValueError("--input needs --tokenizer (the byte corpus is --corpus)")
        corpus = Path(args.corpus) if args.corpus else data.DEFAULT_CORPUS
        try:
            manifest = data.prepare_corpus(
                Path(args.out), corpus, shard_tokens=args.shard_tokens or 1 << 16
            )
        except FileNotFoundError as error:
            raise ValueError(f"--corpus: {error}") from error
    elif args.format == "classify":
        return _prepare_classify(args)
    else:
        from trainer import tokenizing

        if args.input is None or args.corpus is not None:
            raise ValueError("--tokenizer takes --input FILE (and --format), not --corpus")
        manifest = tokenizing.prepare(
            Path(args.out),
            args.tokenizer,
            Path(args.input),
            args.format,
            eval_fraction=args.eval_fraction,
            eval_input=None if args.eval_input is None else Path(args.eval_input),
            seq_len=args.seq_len,
            shard_tokens=args.shard_tokens or 1 << 24,
        )
    print(data.summary(manifest, args.out))
    return 0


def _prepare_classify(args: argparse.Namespace) -> int:
    """``prepare-data --format classify``: the summary line, then the classes and their counts.

    Raises:
        ValueError: ``--input`` missing or ``--corpus`` given; see
            :func:`trainer.classify.data.prepare`.
    """
    from trainer import data
    from trainer.classify import data as classify_data

    if args.input is None or args.corpus is not None:
        raise ValueError("--format classify takes --tokenizer DIR --input FILE, not --corpus")
    manifest = classify_data.prepare(
        Path(args.out),
        args.tokenizer,
        Path(args.input),
        eval_fraction=args.eval_fraction,
        eval_input=None if args.eval_input is None else Path(args.eval_input),
        seq_len=args.seq_len,
        shard_tokens=args.shard_tokens or 1 << 24,
    )
    print(data.summary(manifest, args.out))
    print(classify_data.counts_line(manifest))
    return 0


def _prepare_interactions(args: argparse.Namespace) -> int:
    """``prepare-data --format interactions``: the summary line, then the users, items and
    features.

    Raises:
        ValueError: ``--input`` missing, or ``--tokenizer``, ``--corpus`` or ``--eval-input``
            given; see :func:`trainer.recommend.data.prepare`.
    """
    from trainer import data
    from trainer.recommend import data as rec_data

    if args.input is None or args.tokenizer or args.corpus or args.eval_input:
        raise ValueError(
            "--format interactions takes --input FILE (and --eval-fraction: the latest "
            "interactions are held out), not --tokenizer, --corpus or --eval-input"
        )
    manifest = rec_data.prepare(
        Path(args.out),
        Path(args.input),
        user_features=_names(args.user_features),
        item_features=_names(args.item_features),
        history=args.history,
        eval_fraction=args.eval_fraction,
        shard_tokens=args.shard_tokens or 1 << 24,
    )
    print(data.summary(manifest, args.out))
    print(rec_data.summary_line(manifest))
    return 0


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def compile_config(args: argparse.Namespace) -> TrainConfig:
    """The run that ``trn-train compile`` makes of the run's flags: :data:`PRECOMPILE_STEPS`
    steps, no checkpoints (neither written nor resumed), no metrics, no progress bar.

    Raises:
        ValueError: the flags do not make a valid run (see
            :func:`trainer.model_spec.resolve`).
    """
    cfg = dataclasses.replace(
        train_config(args),
        max_steps=PRECOMPILE_STEPS,
        epochs=0,
        checkpoint_dir="",
        checkpoint_every=0,
        metrics="",
        progress=False,
    )
    from trainer import model_spec

    model_spec.resolve(cfg)
    return cfg


def _compile(args: argparse.Namespace) -> int:
    """``trn-train compile``: checks the node's host memory for one compiler per rank of the
    node (``LOCAL_WORLD_SIZE``), then trains :func:`compile_config`. Returns 1, after one line
    on stderr, when the memory would not hold the compilers."""
    from trainer import hostmem

    cfg = compile_config(args)
    ranks_on_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        hostmem.check_for_compile(args.compile_memory_gib, ranks_on_node, hostmem.available())
    except hostmem.CompileMemoryError as error:
        print(f"trn-train: error: {error}", file=sys.stderr)
        return 1
    from trainer.loop import train

    result = train(cfg)
    print(json.dumps({"compiled_steps": result.steps_done}), file=sys.stderr)
    return 0
