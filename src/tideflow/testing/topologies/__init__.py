"""Broker and database topologies of real processes for tests and benchmarks.

Each module starts one topology on free loopback ports in a directory of the caller's,
exposes the URL(s) to give tideflow, lets a test kill and restart its nodes (and fail
over where that applies), and stops every process it started when it ends, also when
the test fails. The machine's shared services are never touched.
"""
