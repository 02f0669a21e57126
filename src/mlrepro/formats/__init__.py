"""File formats a trainer reads or writes: Megatron's indexed dataset (.bin/.idx) and a run's checkpoint folders.

Leaves: these modules import nothing from mlrepro, so the corpus stages, the chain of segments
and the tests share one reading of each format.
"""
