/* capture.h: stream capture, as the memory hooks and the compute gate need it.
 *
 * While a stream captures (cuStreamBeginCapture_v2), work pushed to it is recorded into a
 * graph, not run. During a capture some calls are "potentially unsafe" (synchronous
 * allocation, event and stream queries and synchronisation): from a thread in GLOBAL mode
 * (the default) they fail and invalidate every GLOBAL capture, the application's included
 * (CUDA driver API, cuThreadExchangeStreamCaptureMode). egpu's own such calls are therefore
 * made in RELAXED mode, and the thread's mode restored afterwards.
 *
 * The driver functions are passed in (NULL when the driver lacks them: CUDA < 10.1), so that
 * the compute gate can be tested with a simulated driver. */
#ifndef EGPU_CAPTURE_H
#define EGPU_CAPTURE_H

#include "egpu_cuda.h"

#define EGPU_STREAM_PER_THREAD ((CUstream)0x2) /* cuda.h's CU_STREAM_PER_THREAD */

typedef CUresult (*egpu_is_capturing_fn)(CUstream s, CUstreamCaptureStatus *status);
typedef CUresult (*egpu_capture_mode_fn)(CUstreamCaptureMode *mode);

/* The stream a call means: a _ptsz entry point's NULL stream is the calling thread's
 * per-thread default stream. */
static inline CUstream egpu_stream_of(CUstream s, int per_thread) { return !s && per_thread ? EGPU_STREAM_PER_THREAD : s; }

/* What the driver says of stream s: 1 it captures, 0 it does not (or the driver has no
 * stream capture), -1 it cannot be asked (an error such as the legacy stream beside a capture,
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the caller's own call fails then). */
static inline int egpu_stream_capture_state(egpu_is_capturing_fn is_capturing, CUstream s)
{
    if (!is_capturing) return 0;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = is_capturing(s, &st);
    if (r == CUDA_ERROR_NOT_SUPPORTED) return 0;
    if (r != CUDA_SUCCESS) return -1;
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* 1 when stream s captures, or cannot be asked (see above); else 0. */
static inline int egpu_stream_capturing(egpu_is_capturing_fn is_capturing, CUstream s)
{
    return egpu_stream_capture_state(is_capturing, s) != 0;
}

typedef struct { int set; CUstreamCaptureMode old; } egpu_capture_relax;

/* Puts the calling thread in RELAXED mode; give the result to egpu_capture_restore. */
static inline egpu_capture_relax egpu_capture_relaxed(egpu_capture_mode_fn exchange)
{
    egpu_capture_relax c = {0, CU_STREAM_CAPTURE_MODE_RELAXED};
    if (exchange) c.set = exchange(&c.old) == CUDA_SUCCESS;
    return c;
}

static inline void egpu_capture_restore(egpu_capture_mode_fn exchange, egpu_capture_relax c)
{
    if (c.set) exchange(&c.old);
}

#endif
