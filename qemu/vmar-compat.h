/*
 * What the vmar block drivers need that differs between QEMU versions
 *
 * The drivers are written against the block layer of QEMU 10 (graph lock
 * annotations, coroutine getlength, thread_pool_submit_co without a pool).
 * This header is the one place that maps that onto the older block layer
 * of QEMU 7.2 (Debian 12), and the only file with version conditionals.
 * Versions between 7.2 and 10.0 are not built or tested: they stop here.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#ifndef BLOCK_VMAR_COMPAT_H
#define BLOCK_VMAR_COMPAT_H

#include "block/block_int.h"
#include "block/thread-pool.h"

#define VMAR_QEMU_AT_LEAST(major, minor) \
    (QEMU_VERSION_MAJOR > (major) || \
     (QEMU_VERSION_MAJOR == (major) && QEMU_VERSION_MINOR >= (minor)))

#if VMAR_QEMU_AT_LEAST(10, 0)

#include "qobject/qdict.h"

#define VMAR_DRV_GETLENGTH          .bdrv_co_getlength
#define VMAR_DRV_GET_INFO           .bdrv_co_get_info

/* The graph lock for the main loop around children's metadata calls */
#define vmar_graph_rdlock_main_loop()   bdrv_graph_rdlock_main_loop()
#define vmar_graph_rdunlock_main_loop() bdrv_graph_rdunlock_main_loop()
/* ... and in coroutines not called with it (timers) */
#define vmar_graph_co_rdlock()          bdrv_graph_co_rdlock()
#define vmar_graph_co_rdunlock()        bdrv_graph_co_rdunlock()
/* ... and the write lock around bdrv_unref_child() */
#define vmar_graph_wrlock()             bdrv_graph_wrlock()
#define vmar_graph_wrunlock()           bdrv_graph_wrunlock()

static inline int coroutine_fn
vmar_thread_pool_submit_co(BlockDriverState *bs, ThreadPoolFunc *func,
                           void *arg)
{
    return thread_pool_submit_co(func, arg);
}

#elif QEMU_VERSION_MAJOR == 7 && QEMU_VERSION_MINOR == 2

#include "qapi/qmp/qdict.h"

/* 7.2 has no graph lock: its annotations and calls mean nothing there */
#define GRAPH_RDLOCK
#define GRAPH_WRLOCK
#define GRAPH_UNLOCKED

#define VMAR_DRV_GETLENGTH          .bdrv_getlength
#define VMAR_DRV_GET_INFO           .bdrv_get_info

#define vmar_graph_rdlock_main_loop()   do { } while (0)
#define vmar_graph_rdunlock_main_loop() do { } while (0)
#define vmar_graph_co_rdlock()          do { } while (0)
#define vmar_graph_co_rdunlock()        do { } while (0)
#define vmar_graph_wrlock()             do { } while (0)
#define vmar_graph_wrunlock()           do { } while (0)

static inline int coroutine_fn
vmar_thread_pool_submit_co(BlockDriverState *bs, ThreadPoolFunc *func,
                           void *arg)
{
    return thread_pool_submit_co(aio_get_thread_pool(bdrv_get_aio_context(bs)),
                                 func, arg);
}

#else
#error "the vmar drivers build on QEMU 7.2 and on QEMU 10.0 or later"
#endif

/* Optional pointer members of QAPI structs lost their has_ flag in 8.0 */
#if VMAR_QEMU_AT_LEAST(10, 0)
#define VMAR_QAPI_SET_HAS(obj, member)  do { } while (0)
#else
#define VMAR_QAPI_SET_HAS(obj, member)  ((obj)->has_##member = true)
#endif

/* .bdrv_co_block_status takes a mode instead of want_zero since 10.1 */
#if VMAR_QEMU_AT_LEAST(10, 1)
typedef unsigned int VmarBlockStatusMode;
#else
typedef bool VmarBlockStatusMode;
#endif

#endif /* BLOCK_VMAR_COMPAT_H */
