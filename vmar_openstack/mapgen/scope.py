"""Which images an image may read blocks from (``[vmar] dedup_scope``)."""


def may_redirect(src, tgt, scope):
    """Whether image ``src`` may read blocks from image ``tgt``."""
    if tgt.seq == src.seq:
        return True
    if (tgt.space_key, tgt.algorithm, tgt.block_size) != (
            src.space_key, src.algorithm, src.block_size):
        return False
    if tgt.state != 'active':
        return False
    if scope == 'global' or tgt.visibility == 'public':
        return True
    if scope == 'project':
        return src.owner is not None and tgt.owner == src.owner
    return False
