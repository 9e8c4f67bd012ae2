"""``lse_sm90``'s exp-domain band fold (``_lazy_attention_lse_sm90_kernel``): the bias range it takes. Imports no DSL
(the GPU tests read it on a machine with only the runtime).

A band tile folds as exp2(q.k scale - max) * exp2(bias), from a table of exp2 of the log2-domain bias, where every
log2-domain bias of the head's table lies within +-EXP_RANGE; a head with a bias past it (or NaN) takes per-tile
tables of the log2-domain bias."""

EXP_RANGE = 32.0
