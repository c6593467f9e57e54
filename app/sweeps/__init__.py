"""Client sweeps (issue 16): the workload at increasing client counts, to find the knee.

service.py creates, lists and cancels them; measure.py measures one; runner.py runs one
under a lease (app/lease.py), resumed after a crash; auto.py picks a session's clients;
schemas.py holds a sweep's request and response bodies.
"""
