"""The simulator's model of the hardware: devices, links and clusters, NCCL's
algorithm choice and collective times, the rates kernels achieve, and the
calibrated numbers they use; `simulation.Simulation` puts them together.

This package imports none of its modules: ask for the one you need."""
