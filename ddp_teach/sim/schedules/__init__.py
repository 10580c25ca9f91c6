"""Step times from a profile and a schedule, without running the ranks:
the textbook DDP, pipeline and ZeRO-3 cases (`predict`), GPipe's and 1F1B's
schedules (`pipeline`) and FSDP2's (`fsdp`).

This package imports none of its modules: ask for the one you need."""
