"""Whole model zoos: many models in, one worker process per model (its own time and memory
limits), in parallel on this machine or on a Ray cluster, resumable, summarized.

``graphpass optimize DIR|GLOB... -o OUTDIR`` and ``graphpass evaluate DIR|GLOB...`` (the CLI,
:mod:`graphpass.cli_zoo`), or from Python::

    for row in graphpass.zoo.run(["models/"], "out/", verb="optimize", options={"verify": True}, jobs=4):
        print(row["model"], row["status"])

Each model runs as ``python -m graphpass VERB MODEL ...`` (:func:`runner.run_task`): a model that
crashes the interpreter, hangs past ``timeout`` or grows past the memory limit is recorded with
that status and the batch goes on. Results go to ``OUTDIR/graphpass-zoo.sqlite``
(:mod:`store`), one row per model and run, written when the model finishes; a rerun skips every
model whose file (and external data) and options are unchanged (``force`` reruns), so a batch
killed halfway finishes only the rest. ``graphpass zoo-report OUTDIR`` (:mod:`report`)
summarizes.
"""

from graphpass.zoo.report import summarize, write_reports
from graphpass.zoo.runner import expand_models, run
from graphpass.zoo.store import DB_NAME, Store

__all__ = ["run", "summarize", "write_reports", "expand_models", "Store", "DB_NAME"]
