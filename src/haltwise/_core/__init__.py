"""The vocabulary: states and their transitions, policies, outcomes and the retry rule, records,
and the exception tree. Pure: no I/O, no event loop; every other layer depends on this one."""
