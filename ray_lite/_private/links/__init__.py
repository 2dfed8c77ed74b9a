"""The links between processes and the loop that drives them.

Owns: ``protocol`` (every message, named once), ``transport`` (a link: a ring
each way), ``drive`` (the wait loop every blocking call runs: ``DrivingMixin``,
``Node``'s base), ``service`` (the driver's service thread), ``loop_bridge``
(asyncio loops driving the links through descriptors), ``mq_network`` (MessageQueue readers on other
machines), ``local_socket`` (this user's Unix sockets that other terminals
reach: Serve's control socket, the driver's state socket).

May import: ``process``, ``ray_lite._fast``, the base modules.
"""
