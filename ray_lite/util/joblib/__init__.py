"""A joblib backend on ray_lite (Ray's ``ray.util.joblib``; needs the ``joblib``
extra: ``pip install 'ray_lite[joblib]'``)::

    import joblib
    from ray_lite.util.joblib import register_ray

    register_ray()
    with joblib.parallel_backend("ray"):
        squares = joblib.Parallel(n_jobs=4)(joblib.delayed(pow)(i, 2) for i in range(100))

Each of joblib's batches of calls runs in a worker of a
``ray_lite.util.multiprocessing.Pool`` (an actor); ray_lite is started if it
is not running.  ``n_jobs=-1`` means every CPU ray_lite was started with.
"""

__all__ = ["register_ray"]


def register_ray():
    """Register ``"ray"`` as a joblib parallel backend (``joblib.parallel_backend("ray")``)."""
    try:
        from joblib.parallel import register_parallel_backend
    except ImportError:
        raise ImportError("the ray joblib backend needs joblib: pip install 'ray_lite[joblib]' "
                          "(or pip install joblib)") from None
    from ray_lite.util.joblib.ray_backend import RayBackend
    register_parallel_backend("ray", RayBackend)
