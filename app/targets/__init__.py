"""Targets: the servers knobtune may reconfigure, their managed sandboxes, and who holds one."""
