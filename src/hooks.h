/*
** hooks.h - createHook's machinery: the enabled hook set, dispatch, the
** delivery of queued destroys.
*/
#ifndef AH_HOOKS_H
#define AH_HOOKS_H

#include "ah.h"

/* The emit functions return 0, or 1 with an error pushed: an error of the
** dispatch that is not a hook's own (a stack overflow, out of memory, an
** error raised by a debug hook; a hook's own error ends the process).
** The event reached every hook all the same; the caller finishes what it
** was doing and then raises it (ah_raise), or hands it on as its
** operation reports errors.  The _reserved form is for callers that made
** room for AH_EMIT_STACK values and checked that hooks of the kind exist. */
#define AH_EMIT_STACK 8       /* what a dispatch pushes */
#define AH_EMIT_INIT_STACK 12 /* the same, for init (4 arguments) */
/* what a caller reserves before it pushes init's type and resource, so
** that the dispatch's own check finds the room (nothing allocates between
** the caller's decision and the dispatch) */
#define AH_INIT_ARGS_STACK (AH_EMIT_INIT_STACK + 4)
/* what ah_flush_status reserves: a dispatch, an error kept, the call of
** on_destroy_hooks' callback */
#define AH_FLUSH_STACK 16
int ah_emit_id(lua_State *L, ah_state *st, int kind, lua_Integer id);
int ah_emit_id_reserved(lua_State *L, ah_state *st, int kind, lua_Integer id);
int ah_emit_init_v(lua_State *L, ah_state *st, lua_Integer id, int type_idx,
                   lua_Integer trigger, int res_idx);
int ah_emit_init(lua_State *L, ah_state *st, lua_Integer id, const char *type,
                 lua_Integer trigger, int res_idx);
int ah_raise(lua_State *L);
int ah_reraised(lua_State *L, ah_state *st, int idx);
int ah_cstack_error(lua_State *L, int idx);
/* keep the first of two errors (first, err: 1 when each was pushed, the
** first below): returns 1 when one is left on top */
static inline int ah_keep_first(lua_State *L, int first, int err) {
  if (first && err) lua_pop(L, 1);
  return first || err;
}

/* tell on_destroy_hooks' callback whether destroy hooks exist (Lua code:
** only where raising is fine) */
void ah_notify_destroy_hooks(lua_State *L, ah_state *st);
/* deliver queued destroys: 0, or 1 with the first error pushed */
int ah_flush_status(lua_State *L, ah_state *st);
void ah_flush(lua_State *L, ah_state *st);
/* at the end of an outermost callback, resume or scope: deliver queued
** destroys (and notify of destroy hooks); Lua code, can raise */
#define ah_flush_due(st) \
  (((st)->dq_n || (st)->notify_pending) && !(st)->active && !(st)->dispatching)
#define ah_flush_maybe(L, st) \
  do { \
    if (ah_flush_due(st)) ah_flush((L), (st)); \
  } while (0)
/* the hook lists, the dispatch's registry keys, the hook functions */
void ah_open_hooks(lua_State *L);

#endif
