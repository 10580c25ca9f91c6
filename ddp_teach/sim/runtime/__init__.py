"""The simulator at run time: each rank's virtual clock (`recorder`), what
every tensor operation is charged (`charges`, `attention`), async works in
virtual time (`works`), one rank of thousands in this process (`one_rank`),
and DataParallel's devices in one process (`dataparallel_gpus`).

This package imports none of its modules: ask for the one you need."""
