"""A worker's task runner (compiled twin ``_task_runner_c``, fallback
``_task_runner_py``): the steps a worker takes per call, between the
message's arrival and the result's send.

``TaskRunner``
    The first base of ``WorkerNode``; its fields are the worker's:
    ``functions``, ``cancelled``, ``live``, ``links``, ``current_oid``,
    ``current_fn``, ``current_name`` (the pool task running, or None),
    ``current_thread_busy``, ``_interrupted``, ``_in_user_code``,
    ``_interrupt``, ``_cancel_signalled``, ``blocked_depth``, ``_bridges``,
    ``kind``, ``tasks``, ``exiting``, ``_releases``, ``_drive_lock``,
    ``_sleepers``, ``_bridge_waiting``; and the runtime's names, set by the
    worker: ``ref_type`` (ObjectRef), ``result_op`` (protocol.RESULT),
    ``never_stored`` (result types never put in the object store) and
    ``store_result``.

    ``serve_calls(run)`` is the main loop of a pool worker or a sync actor:
    ``run(peer, msg)`` for each call in ``tasks``, and, idle, a drive of
    the links (``_poll``) or a wait for the thread that drives them;
    ``_on_task(peer, msg)`` queues a task's message there.
    ``run_pool_task(peer, msg)`` runs a pool task's message (protocol.TASK)
    and answers it; ``_invoke(peer, oid, fn, args, kwargs, nret, stream, bp,
    name)`` calls ``fn`` (a task's function or an actor's bound method) and
    sends its result, its items (``stream``) or its failure.  What is not the
    common case goes to the worker's methods: ``_drain``,
    ``_release_drive``, ``_poll``, ``_wake_after_release``, ``wait_until``,
    ``_send_releases``, ``_load_function``, ``_resolve``, ``_failure``,
    ``_send_failure``, ``_send_cancelled``, ``_enter_user_code``,
    ``_await_result``, ``_run_stream``, ``_split``, ``_unsendable``,
    ``_lend_slot_for_good``, ``_close_finished_bridges``.
"""
from ._select import load_twin

_impl, COMPILED = load_twin("task_runner")

TaskRunner = _impl.TaskRunner

__all__ = ["COMPILED", "TaskRunner"]
