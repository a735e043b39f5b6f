"""Topologies of real processes for the tests, benchmarks and the nemesis
(``tests/chaos/``): each module starts one on free loopback ports in a temporary
directory, gives the URL(s) to hand tideflow, lets a test kill, restart, promote or fail
over its nodes, and removes everything at the end, also when the test fails."""
