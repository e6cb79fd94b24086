/*
** anchors.h - what keeps a slot's Lua values alive exactly as long as its
** thread: the thread-keyed anchors, the frame and resource writes that go
** with them, a thread's current resource.
*/
#ifndef AH_ANCHORS_H
#define AH_ANCHORS_H

#include "ah.h"

/* "no resource": nil, or the false that R[s] holds for it */
static inline int ah_no_resource(lua_State *L, int idx) {
  return lua_isnil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx));
}
void ah_eph_set(lua_State *L, ah_state *st, int eph, int thread_idx, int idx);
int ah_frame_plain(lua_State *L, ah_state *st, int idx);
void ah_pend_set(lua_State *L, int s, int idx);
void ah_aux_eph_set(lua_State *L, int key, int thread_idx, int idx);
void ah_new_thread_resource(lua_State *L, int thread_idx);
/* what making a thread's current resource pushes (ah_push_resource,
** st->lazy_resource) */
#define AH_RESOURCE_STACK 6
void ah_push_resource(lua_State *L, ah_state *st, int s);
void ah_push_resource_of(lua_State *L, ah_state *st, int s, int thread_idx);
void ah_reserve(lua_State *L, int s);
void ah_reserve_res(lua_State *L, int s);
void ah_get_guard(lua_State *L, int thread_idx);
void ah_set_guard(lua_State *L, int idx);
void ah_set_frame(lua_State *L, int s, int idx);
void ah_set_new_frame(lua_State *L, ah_state *st, int s, int idx,
                      int plain);
void ah_set_resource(lua_State *L, int s, int idx);
/* the anchor tables (AUX_PEND, AUX_TR, AUX_TG, AUX_TGC), the top-level
** resource, the "thread" key */
void ah_open_anchors(lua_State *L);

#endif
