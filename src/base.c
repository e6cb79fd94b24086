/*
** base.c - small helpers every other unit may call: the bottom of the
** graph (it calls no other file of the core).  Also the error position
** past the library's own Lua files (ah_where, set_libdir).
*/
#include <string.h>

#include "base.h"

/* The state checked last (see ah_st), or else the address of this very
** variable: no userdata's block, nothing handed out as a light userdata,
** so that nothing passes for it (NULL would: a value that is no userdata) */
ah_state *ah_known = (ah_state *)(void *)&ah_known;

/* ah_st's full check: AH_UV_STATE is a userdata of a state's size whose
** block points to itself (only this library's C code writes that); NULL
** or an error when it is not */
ah_state *ah_st_check(lua_State *L, int raise) {
  ah_state *st = (ah_state *)lua_touserdata(L, AH_UV_STATE);
  if (st == NULL || lua_rawlen(L, AH_UV_STATE) != sizeof(ah_state) ||
      st->self != st) {
    if (raise)
      luaL_error(L, "async_hooks: internal state damaged (upvalue 2 is not "
                    "the library's state)");
    return NULL;
  }
  /* the first state checked is remembered (the common case: one Lua state
  ** per process), a closed one never */
  if (!st->closed && ah_load_ptr(ah_known) == (ah_state *)(void *)&ah_known)
    ah_store_ptr(ah_known, st);
  return st;
}

void ah_st_forget(ah_state *st) {
  if (ah_load_ptr(ah_known) == st)
    ah_store_ptr(ah_known, (ah_state *)(void *)&ah_known);
}

/* the shared upvalue at idx is not a table (AH_UVT) */
int ah_damaged(lua_State *L, int idx) {
  return luaL_error(L, "async_hooks: internal state damaged (upvalue %d is "
                       "a %s, not a table)", (int)(LUA_REGISTRYINDEX - idx),
                    luaL_typename(L, idx));
}

/* the shared upvalues named by the bits of which (AH_TF, ...) are tables */
int ah_tables_ok(lua_State *L, int which) {
  static const int uv[] = {AH_UVI_F, AH_UVI_R, AH_UVI_T, AH_UVI_AUX, AH_UVI_TH};
  int i;
  for (i = 0; i < 5; i++)
    if ((which & (1 << i)) && lua_type(L, uv[i]) != LUA_TTABLE) return 0;
  return 1;
}

/* push aux[key], which must be a table (raises, with nothing pushed, if
** something put another value there); returns its index */
int ah_auxt(lua_State *L, int key) {
  if (ah_unlikely(lua_rawgeti(L, AH_UV_AUX, key) != LUA_TTABLE)) {
    lua_pop(L, 1);
    luaL_error(L, "async_hooks: internal state damaged (entry %d of its "
                  "table is not a table)", key);
  }
  return lua_gettop(L);
}

/* the block of the userdata at idx if it is one of the library's objects
** of that size whose first field is tag (a pointer only its C code
** writes there), else NULL; never reads outside the value's memory */
void *ah_testudata(lua_State *L, int idx, size_t size, const void *tag) {
  void *p = lua_touserdata(L, idx);
  if (p == NULL || lua_rawlen(L, idx) != size || *(const void *const *)p != tag)
    return NULL;
  return p;
}

/* the same for the library's objects whose first field points to
** themselves (the state, the luv state, the luv specs) */
void *ah_testself(lua_State *L, int idx, size_t size) {
  void *p = lua_touserdata(L, idx);
  if (p == NULL || lua_rawlen(L, idx) != size || *(const void *const *)p != p)
    return NULL;
  return p;
}

/* the userdata at idx gets the metatable of internal objects (AH_NULLOBJ) */
void ah_internal_mt(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_rawgeti(L, AH_UV_AUX, AUX_INTERNAL_MT) == LUA_TTABLE)
    lua_setmetatable(L, idx);
  else
    lua_pop(L, 1);
}

/* the slot array (the userdata on top, or nil: popped) is kept alive by
** AUX_SLOTS and by the state's metatable (its [1]), so that no one change
** of a table frees it while the state points to it */
void ah_anchor_slots(lua_State *L) {
  if (ah_st_try(L) != NULL && lua_getmetatable(L, AH_UV_STATE)) {
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, 1); /* (made at creation: no allocation) */
    lua_pop(L, 1);
  }
  lua_rawseti(L, AH_UV_AUX, AUX_SLOTS); /* an array slot: no allocation */
}

/* push the shared upvalues of the running core function (AH_UV_*), after
** a nil in the place of its own upvalue */
void ah_push_shared(lua_State *L) {
  int i;
  lua_pushnil(L);
  for (i = 2; i <= AH_NUP; i++) lua_pushvalue(L, lua_upvalueindex(i));
}

/* module table on top: add the functions of l, with the shared upvalues */
void ah_add_funcs(lua_State *L, const luaL_Reg *l) {
  ah_push_shared(L);
  luaL_setfuncs(L, l, AH_NUP);
}

/* aux[aux_key] = a new metatable named name, whose metamethod `event`
** (__gc, __close, ...; none when fn is NULL) is fn with the shared upvalues */
void ah_new_metatable(lua_State *L, const char *name, const char *event,
                      lua_CFunction fn, int aux_key) {
  lua_createtable(L, 0, 2);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  if (fn) {
    ah_push_shared(L);
    lua_pushcclosure(L, fn, AH_NUP);
    lua_setfield(L, -2, event);
  }
  lua_rawseti(L, AH_UV_AUX, aux_key);
}

/* push a new table with __mode = mode and narr array slots */
void ah_weak_table(lua_State *L, const char *mode, int narr) {
  lua_createtable(L, narr, 0);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
}

/* a function, or a table/userdata with a __call metamethod */
int ah_callable(lua_State *L, int idx) {
  int t = lua_type(L, idx);
  if (t == LUA_TFUNCTION) return 1;
  if (t != LUA_TTABLE && t != LUA_TUSERDATA) return 0;
  if (luaL_getmetafield(L, idx, "__call") == LUA_TNIL) return 0;
  lua_pop(L, 1);
  return 1;
}

/* luaL_where(L, level), past the frames of the library's own Lua files
** (AUX_LIBDIR): a public function written in Lua that the user called in
** tail position has no caller frame left, and the next frame may be a
** library scope's; the position is then the nearest user code's.  Called
** by core functions (the shared upvalues), on error paths only. */
void ah_where(lua_State *L, int level) {
  lua_Debug ar;
  size_t n = 0;
  const char *dir = NULL;
  luaL_checkstack(L, 2, "async_hooks");
  if (lua_rawgeti(L, AH_UV_AUX, AUX_LIBDIR) == LUA_TSTRING)
    dir = lua_tolstring(L, -1, &n);
  while (dir && lua_getstack(L, level, &ar) && lua_getinfo(L, "S", &ar) &&
         strncmp(ar.source, dir, n) == 0)
    level++;
  lua_pop(L, 1); /* (AUX keeps dir alive) */
  luaL_where(L, level);
}

/* set_libdir(dir): the folder of the library's Lua files (see ah_where) */
static int l_set_libdir(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_settop(L, 1);
  lua_rawseti(L, AH_UV_AUX, AUX_LIBDIR);
  return 0;
}

/* registry[&ah_debug_key] = {report, seen} while debug mode is on.  The
** registry, not the aux table: luv can call back from its own C functions,
** where the core's upvalues are not at hand (the key is reachable from Lua
** as a light userdata: it points to a null pointer, see ah.h, AH_NULLOBJ) */
static const void *const ah_debug_key = NULL;

/* push the entry i of the debug table: 1 with it pushed, else 0 with
** nothing pushed (debug mode off, or the table damaged); needs 2 slots */
static int debug_entry(lua_State *L, int i, int type) {
  int top = lua_gettop(L);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ah_debug_key) == LUA_TTABLE &&
      lua_rawgeti(L, -1, i) == type) {
    lua_remove(L, -2);
    return 1;
  }
  lua_settop(L, top);
  return 0;
}

void ah_debug_report(lua_State *L, int kind, int idx) {
  int top = lua_gettop(L);
  if (idx) idx = lua_absindex(L, idx);
  /* (only what cannot raise: luv's dispatch calls this) */
  if (!lua_checkstack(L, 4)) return;
  if (idx && debug_entry(L, 2, LUA_TTABLE)) {
    lua_pushvalue(L, idx);
    if (lua_rawget(L, -2) != LUA_TNIL) {
      lua_settop(L, top);
      return;
    }
    lua_settop(L, top);
  }
  if (debug_entry(L, 1, LUA_TFUNCTION)) {
    lua_pushinteger(L, kind);
    if (idx) lua_pushvalue(L, idx); else lua_pushnil(L);
    (void)lua_pcall(L, 2, 0, 0); /* (a diagnostic: its errors are dropped) */
  }
  lua_settop(L, top);
}

void ah_debug_seen(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  luaL_checkstack(L, 3, "async_hooks");
  if (debug_entry(L, 2, LUA_TTABLE)) {
    lua_pushvalue(L, idx);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
}

/* set_debug(report, seen): debug mode on, with the function that hears of
** what it finds and the (weak-keyed) set of callbacks the luv wrappers
** saw; set_debug(nil): off */
static int l_set_debug(lua_State *L) {
  ah_state *st = ah_st(L);
  if (lua_isnoneornil(L, 1)) {
    st->debug = 0;
    lua_pushnil(L);
  } else {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_createtable(L, 2, 0);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, 2);
  }
  lua_rawsetp(L, LUA_REGISTRYINDEX, &ah_debug_key);
  if (!lua_isnoneornil(L, 1)) st->debug = 1;
  return 0;
}

static const luaL_Reg base_funcs[] = {
  {"set_libdir", l_set_libdir},
  {"set_debug", l_set_debug},
  {NULL, NULL}
};

void ah_open_base(lua_State *L) {
  ah_new_metatable(L, "async_hooks.internal", NULL, NULL, AUX_INTERNAL_MT);
  ah_add_funcs(L, base_funcs);
}
