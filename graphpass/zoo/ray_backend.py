"""``--backend ray``: the same worker (:func:`graphpass.zoo.runner.run_task`, one model in its own
process under its limits) as a Ray task per model. Results come back to the driver, which alone
writes the SQLite file. Models and outputs are read and written through paths every node sees
(a shared folder). ``ray`` is an optional extra (``pip install 'graphpass[ray]'``)."""

from __future__ import annotations

from typing import Any, Iterator

from graphpass.errors import UsageError

__all__ = ["run_on_ray"]


def _ray():
    try:
        import ray
    except ImportError as e:
        raise UsageError("the ray backend needs the 'ray' package: pip install 'graphpass[ray]'") from e
    return ray


def run_on_ray(todo: list, jobs: int, address: str | None, state: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Run the tasks on the Ray cluster at ``address`` (None: a local one of ``jobs`` CPUs),
    yielding each result as it finishes."""
    ray = _ray()
    from graphpass.zoo.runner import run_task

    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - a cluster that cannot be reached: one line
            raise UsageError(f"cannot start or join the Ray cluster{f' at {address}' if address else ''}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    remote = ray.remote(num_cpus=1, max_retries=0)(_on_node)
    try:
        pending = {}
        for t in todo:
            t.extra["backend"] = "ray"
            pending[remote.remote(t)] = t
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                t = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as e:  # noqa: BLE001 - the task itself died (node lost): recorded
                    yield {"model": t.model, "path": str(t.path), "verb": t.verb, "input_hash": t.input_hash,
                           "options": t.options_json, "options_hash": t.options_hash, "status": "crash",
                           "exit_code": None, "error": f"the Ray task failed: {type(e).__name__}", "backend": "ray"}
    finally:
        for ref in list(locals().get("pending", {})):
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def _on_node(task):
    from graphpass.zoo.runner import run_task

    return run_task(task)
