"""ZeRO stage 3: FullyShardedDataParallel from scratch.

Stage 3 of ZeRO (Rajbhandari et al., SC'20, arXiv:1910.02054) shards the
parameters themselves: each rank keeps 1/N of every parameter and gathers a
layer's full parameters only while that layer computes. PyTorch FSDP (Zhao et
al., "PyTorch FSDP", VLDB 2023, arXiv:2304.11277) organises this in *units*:

* units.py: each unit (by default, each direct child module that has
  parameters; the root's leftover parameters form one more) flattens its
  parameters into one vector, pads it to a multiple of N, and keeps only its
  shard as a leaf `nn.Parameter`, registered on the unit's module as
  `flat_param_shard`. So `model.parameters()` yields the shards, and any
  optimizer built on them is sharded too: parameters, gradients and
  optimizer state are all 1/N.
* wrapper.py: before a unit runs, all-gather its full flat vector and point
  the module's attributes (`weight`, `bias`, ...) at views of it; after it
  runs, drop them. The all-gather is an autograd Function whose backward
  reduce-scatters the full vector's gradient into the shard's gradient,
  averaged over ranks: the gradients arrive sharded, for free. Backward needs
  the full parameters again, so a `saved_tensors_hooks` pack hook replaces
  every saved view of them by a note, and the unpack hook re-gathers the unit
  when backward needs it; the next unit's gather is prefetched.
* replicated.py: with `rest="replicate"`, the parameters outside every unit
  (norms, small biases) are not sharded: every rank keeps them whole, as DDP
  does, and one all-reduce at the end of backward averages their gradients.
* Mixed precision (`compute_dtype`, `reduce_dtype`), the ZeRO paper's
  recipe: the shards, their gradients and the optimizer state stay fp32 (the
  master weights); each all-gather sends the shard cast to 16 bits, so the
  layers compute in 16 bits and the gathers move half the bytes; gradients
  are reduce-scattered in `reduce_dtype` and accumulated in fp32.

Per step that is two all-gathers and one reduce-scatter of Psi: 3 Psi, 1.5x
plain DP's all-reduce (2 Psi). Not done here: nested units, activation
checkpointing.
"""
from ddp_teach.fsdp.wrapper import FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel"]
