"""knobtune's search core: knob space, coordinate descent, verdict, rendering.

Pure by design: no I/O, no environment, no database, no HTTP. Depends on
numpy and scipy only, so it is testable in milliseconds and the service can
rebuild its state by replaying stored trials.
"""
