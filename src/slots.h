/*
** slots.h - the native store of execution contexts: slot allocation and
** lifetime, thread bindings, the ids.
*/
#ifndef AH_SLOTS_H
#define AH_SLOTS_H

#include "ah.h"

int ah_slot_slow(lua_State *L, ah_state *st);
/* The slot of the running thread.  Reading the extra space is safe even
** when the host owns it (st->extra == 0): a value passes only if slot s
** names this very thread, and then s is its slot. */
static inline int ah_slot_of(lua_State *L, ah_state *st) {
  if (AH_EXTRA_FITS) {
    uintptr_t s = ah_extra(L);
    if (s < (uintptr_t)st->cap && st->slots[s].L == L) return (int)s;
  }
  return ah_slot_slow(L, st);
}
/* F[s] is read next: write a callback's pending frame into it (see
** ah_state's pend_frame) */
static inline void ah_frame_sync(lua_State *L, ah_state *st, int s) {
  if (ah_unlikely(st->pend_frame == s)) st->sync_frame(L, st);
}
int ah_slot_find(lua_State *L, ah_state *st, lua_State *th, int thread_idx);
void ah_bind_thread(lua_State *L, ah_state *st, int s, int thread_idx);
void ah_bind_thread_table(lua_State *L, int s, int thread_idx);
void ah_reserve_binding(lua_State *L, ah_state *st, int thread_idx);
int ah_register(lua_State *L, ah_state *st, int thread_idx, int frame_idx,
                lua_Integer trigger, int kind);
int ah_take_slot(lua_State *L, ah_state *st, lua_State *co,
                 lua_Integer trigger);
void ah_arm_anchors(lua_State *L, ah_state *st);
void ah_rearm(lua_State *L, ah_state *st);
void ah_release(lua_State *L, ah_state *st, int s);
/* the slot array, the main thread, the metatables of tokens and of the
** sentinel, the id functions */
void ah_open_slots(lua_State *L);
/* the main thread: slot 1, asyncId 1, the empty frame (once frames exist) */
void ah_register_main(lua_State *L);

#endif
