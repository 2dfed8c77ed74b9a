"""The core runtime behind ray_lite's public API, in packages named by what they own.

From the bottom up (a package may import the ones below it, never one above;
``tests/package/test_layers.py`` checks it, ``docs/architecture.md`` draws it):

  process     what every process of the runtime is: its node slot, the engine, ids, errors
  links       the links between processes, the wait loop, the service thread, messages
  objects     refs, values, the shared-memory store, streams a process owns
  job         the job's settings: runtime_env, logging, job_config
  scheduling  resources, placement groups, the driver's pool tasks
  actors      an actor's calls in its own process, restarts, exits
  node        the node each process holds: the driver's, a worker's, the zygote
  api         what the public functions and classes do (init, get, remote, handles)
"""
