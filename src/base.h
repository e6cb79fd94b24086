/*
** base.h - helpers every unit may use: the state check, the checked
** shared upvalues, tables, metatables, the error position.  Calls nothing
** above it.
*/
#ifndef AH_BASE_H
#define AH_BASE_H

#include "ah.h"

/* the shared upvalues, checked to be a table at each use (a raw access to
** anything else is undefined behaviour); the AH_UVI_* indices unchecked,
** for code that checked them itself (ah_tables_ok) */
#define AH_UV_F AH_UVT(L, AH_UVI_F)
#define AH_UV_R AH_UVT(L, AH_UVI_R)
#define AH_UV_T AH_UVT(L, AH_UVI_T)
#define AH_UV_AUX AH_UVT(L, AH_UVI_AUX)
#define AH_UV_TH AH_UVT(L, AH_UVI_TH)
#define AH_UVT(L, idx) \
  (ah_likely(lua_type((L), (idx)) == LUA_TTABLE) ? (idx) : ah_damaged((L), (idx)))
int ah_damaged(lua_State *L, int idx);
int ah_tables_ok(lua_State *L, int which);

/* The state of the running core function, from its AH_UV_STATE: a
** userdata whose block is the state of this Lua state (or anything else,
** if the debug library put it there).  The state that was checked last is
** remembered (ah_known), so that checking it costs a comparison: a value
** whose block is at that address is that very userdata (two live objects
** cannot share an address, and Lua code cannot make a light userdata of an
** address the library never handed out as one; ah_known is never NULL:
** see base.c).  Its self pointer is read all the same: a state whose
** finalizer the debug library took away is freed without forgetting it.
** Anything else is checked in full by ah_st_check (its size, its self
** pointer); raises if it is not a state. */
extern ah_state *ah_known;
ah_state *ah_st_check(lua_State *L, int raise);
static inline ah_state *ah_st(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, AH_UV_STATE);
  if (ah_likely(st == ah_load_ptr(ah_known) && st->self == st)) return st;
  return ah_st_check(L, 1);
}
/* the same without raising: NULL when AH_UV_STATE is not a state */
static inline ah_state *ah_st_try(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, AH_UV_STATE);
  if (ah_likely(st == ah_load_ptr(ah_known) && st->self == st)) return st;
  return ah_st_check(L, 0);
}
/* the state is closed: ah_known forgets it */
void ah_st_forget(ah_state *st);

int ah_auxt(lua_State *L, int key);
void *ah_testudata(lua_State *L, int idx, size_t size, const void *tag);
void *ah_testself(lua_State *L, int idx, size_t size);
void ah_internal_mt(lua_State *L, int idx);
void ah_anchor_slots(lua_State *L);
void ah_push_shared(lua_State *L);
void ah_add_funcs(lua_State *L, const luaL_Reg *l);
void ah_new_metatable(lua_State *L, const char *name, const char *event,
                      lua_CFunction fn, int aux_key);
void ah_weak_table(lua_State *L, const char *mode, int narr);
int ah_callable(lua_State *L, int idx);
void ah_where(lua_State *L, int level);
/* The diagnostic of silent context loss (set_debug; on while st->debug):
** report(kind, value) of the Lua front end, called protected, its errors
** dropped; never raises.  value (at idx; 0: none) is left out when it is in
** the set of callbacks the luv wrappers saw (ah_debug_seen) */
enum { AH_DEBUG_COROUTINE = 1, AH_DEBUG_LUV };
AH_COLD void ah_debug_report(lua_State *L, int kind, int idx);
/* the value at idx goes into that set (allocates) */
AH_COLD void ah_debug_seen(lua_State *L, int idx);
/* module table on top: the internal objects' metatable, set_libdir,
** set_debug */
void ah_open_base(lua_State *L);

#endif
