"""Example applications shipped inside the package, so that ``ray-lite bench``
runs them from an installed wheel as from the checkout.  Not an API: the
checkout's ``examples/`` folder is where users start, and it imports these.
"""
