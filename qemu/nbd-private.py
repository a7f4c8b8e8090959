#!/usr/bin/env python3
"""Make QEMU's NBD server list no exports (nbd/server.c).

vmar-export gives every holder (an instance) its own NBD export whose name
carries a random key: a QEMU can open only the exports whose names it was
given. NBD_OPT_LIST would hand every name to any client of the socket, so
the patched server answers it with an empty list. Opening an export by
name (NBD_OPT_GO, NBD_OPT_EXPORT_NAME) is unchanged, and an unknown name
gets the usual NBD_REP_ERR_UNKNOWN.

The edit is idempotent and fails loudly if the source does not look as
expected (srcedit.py).

Usage: nbd-private.py QEMU_SOURCE_DIR
"""

import srcedit

OLD = """    NBDExport *exp;
    assert(client->opt == NBD_OPT_LIST);

    /* For each export, send a NBD_REP_SERVER reply. */
    QTAILQ_FOREACH(exp, &exports, next) {
        if (nbd_negotiate_send_rep_list(client, exp, errp)) {
            return -EINVAL;
        }
    }
    /* Finish with a NBD_REP_ACK. */
    return nbd_negotiate_send_rep(client, NBD_REP_ACK, errp);
"""

NEW = """    assert(client->opt == NBD_OPT_LIST);

    /*
     * vmar-openstack: no export is listed.  An export's name carries the
     * key of the one holder allowed to open it.
     */
    return nbd_negotiate_send_rep(client, NBD_REP_ACK, errp);
"""

# nbd_negotiate_send_rep_list has no other caller: unused, it would warn
UNUSED_OLD = ("static coroutine_fn int\n"
              "nbd_negotiate_send_rep_list(")
UNUSED_NEW = ("static coroutine_fn int G_GNUC_UNUSED\n"
              "nbd_negotiate_send_rep_list(")


EDITS = [
    (OLD, NEW, "NBD_OPT_LIST handler"),
    (UNUSED_OLD, UNUSED_NEW, "list reply helper"),
]


if __name__ == "__main__":
    srcedit.main(__doc__, "nbd-private.py", "nbd/server.c",
                 "vmar-openstack", EDITS)
