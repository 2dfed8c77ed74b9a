"""``RayBackend``: joblib's multiprocessing backend with a
``ray_lite.util.multiprocessing.Pool`` in place of the standard library's pool.

joblib hands its backend batches of calls through the pool's
``apply_async`` (with a callback for each result), which the ray_lite pool
offers with the standard library's semantics; what differs is only how many
workers there are and that they are ray_lite actors, not forked children.
"""
from joblib._parallel_backends import MultiprocessingBackend

import ray_lite
from ray_lite.util.multiprocessing import Pool


class RayBackend(MultiprocessingBackend):
    """joblib's ``"ray"`` backend (see ``ray_lite.util.joblib.register_ray``).

    ``ray_remote_args`` are the pool workers' actor options."""

    supports_return_generator = False

    def __init__(self, nesting_level=None, inner_max_num_threads=None, ray_remote_args=None,
                 **kwargs):
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **kwargs)
        self.ray_remote_args = ray_remote_args

    def effective_n_jobs(self, n_jobs):
        """The pool's size for ``n_jobs``: as given; -1 every CPU ray_lite has,
        -2 all but one, and so on.  The multiprocessing backend's refusal to
        nest does not apply: the workers are actors, not forked children."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max(_cpus() + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **_pool_kwargs):
        n_jobs = self.effective_n_jobs(n_jobs)
        self._pool = Pool(processes=n_jobs, ray_remote_args=self.ray_remote_args)
        self.parallel = parallel
        return n_jobs


def _cpus():
    if not ray_lite.is_initialized():
        ray_lite.init()
    return max(1, int(ray_lite.cluster_resources().get("CPU", 1)))
