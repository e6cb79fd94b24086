/*
** record.c - what a registration hands luv, read back: records, quick
** records, their resources, where a handle keeps them, the native stack of
** entered records.
**
** A record (private.h's ah_rec) is a userdata with the registration's ids,
** spec and frame identity; a quick record a C closure whose upvalues are
** the same fields (made where nothing but a frame observes the
** registration).  This file recognises them, turns a quick record into a
** record where a path needs one, makes a record's resource table when it
** is first asked for (executionAsyncResource(), ah_luv_resource through
** st->lazy_resource), and is what luv calls for a quick record when the
** dispatch is not in front.  Called by register.c and dispatch.c.
*/
#include <stdlib.h>
#include <string.h>

#include "private.h"

const void *const ah_luv_key = NULL; /* (see ah.h, AH_NULLOBJ) */

/* the callback stack outgrew its array (see private.h's cb_push); 0 when
** no memory, or inside lua_close: the callers cope */
AH_COLD int ah_luv_cb_grow(ah_luv *lv) {
  size_t ncap = lv->cb_cap * 2;
  lua_Integer *n;
  if (lv->closed) return 0;
  if (lv->cb == lv->cb_inline) {
    n = malloc(ncap * sizeof *n);
    if (n) memcpy(n, lv->cb_inline, sizeof lv->cb_inline);
  } else {
    n = realloc(lv->cb, ncap * sizeof *n);
  }
  if (!n) return 0;
  lv->cb = n;
  lv->cb_cap = ncap;
  return 1;
}

AH_COLD void ah_luv_cb_shrink(ah_luv *lv) {
  memcpy(lv->cb_inline, lv->cb, lv->cb_n * sizeof *lv->cb);
  free(lv->cb);
  lv->cb = lv->cb_inline;
  lv->cb_cap = AH_CB_INLINE;
}

/* push registry[&ah_luv_key]; the state's ah_luv if that is one (the
** registry is reachable from Lua), else NULL */
ah_luv *ah_luv_push(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &ah_luv_key);
  return ah_luv_at(L, -1);
}

/* the spec at idx if it is one of lv's, else NULL */
const ah_spec *ah_luv_spec(lua_State *L, const ah_luv *lv, int idx) {
  const ah_spec *sp = (const ah_spec *)ah_testself(L, idx, sizeof(ah_spec));
  return sp && lv && sp->lv == lv ? sp : NULL;
}

/* The record as a function, for the luv functions that accept nothing
** else (new_async, new_work): a closure with the record as last upvalue. */
int ah_luv_rec_fn(lua_State *L) {
  int n = lua_gettop(L);
  lua_pushvalue(L, RF_REC);
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET); /* its __call: ah_luv_rec_call */
  return lua_gettop(L);
}

/* The record as a function for a re-armed handle slot (see register.c's
** rearm): a closure with the record as only upvalue.  luv calls it only
** without our cb_pcall in front (after uninstall()): the record's __call. */
int ah_luv_rec_fn1(lua_State *L) {
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(RF1_REC_N));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

/* the value at idx is a record of this state: a full userdata of a
** record's size whose first field is lv (a table's raw length is its
** border, which can be anything: the type is tested first) */
static int is_record(lua_State *L, const ah_luv *lv, int idx) {
  const ah_rec *r = (const ah_rec *)lua_touserdata(L, idx);
  return r && lv && lua_rawlen(L, idx) == sizeof(ah_rec) && r->lv == lv;
}

/* the record at idx, or NULL (a userdata of a record's size whose first
** field is this state's ah_luv: what luv holds and the record closures'
** upvalues are reachable from Lua); a record closure at idx is replaced
** by its record */
ah_rec *ah_luv_record(lua_State *L, const ah_luv *lv, int idx) {
  ah_rec *r = (ah_rec *)lua_touserdata(L, idx);
  if (r == NULL) { /* not a userdata: a record closure? */
    lua_CFunction f = lua_tocfunction(L, idx);
    int up;
    if (f == NULL || lv == NULL) return NULL;
    if (f == ah_luv_q_fn) up = Q_RES; /* its record, once made (q_record) */
    else if (!lv->closures) return NULL;
    else if (f == ah_luv_rec_fn1) up = RF1_REC_N;
    else if (f == ah_luv_rec_fn) up = RF_REC_N;
    else return NULL;
    if (idx < 0) idx = lua_absindex(L, idx);
    lua_getupvalue(L, idx, up);
    if (up == Q_RES && !is_record(L, lv, -1)) {
      lua_pop(L, 1); /* the resource, the handle or nil: no record yet */
      return NULL;
    }
    lua_replace(L, idx);
    if ((r = (ah_rec *)lua_touserdata(L, idx)) == NULL) return NULL;
  }
  return lv && lua_rawlen(L, idx) == sizeof(ah_rec) && r->lv == lv ? r : NULL;
}

/* The record of a quick record, for the paths that need one (the slow
** dispatch, luv calling it without the dispatch in front): made once from
** its fields, the values at base .. top (its upvalues, in order), which are
** replaced by it; kept in its Q_RES from then on, so that every path finds
** the same record, and the same resource.  Allocates. */
static ah_rec *q_build(lua_State *L, const ah_luv *lv, int base) {
  const ah_spec *sp = ah_luv_spec(L, lv, base + Q_SPEC - 1);
  int i, rec;
  ah_rec *r;
  if (sp == NULL || ah_luv_push(L) != lv ||
      lua_getiuservalue(L, -1, LV_RECMT) != LUA_TTABLE)
    luaL_error(L, "async_hooks: internal state damaged (a luv quick record)");
  lua_pop(L, 1);
  r = (ah_rec *)lua_newuserdatauv(L, sizeof(ah_rec), RV_N + sp->nf);
  rec = lua_gettop(L);
  r->lv = sp->lv;
  r->id = ah_luv_q_unpack(lua_tointeger(L, base + Q_IDS - 1), &r->trigger);
  r->spec = sp;
  r->frame = lua_topointer(L, base + Q_FRAME - 1);
  r->fslot = AH_FSLOT_MAX;
  r->fgen = 0;
  r->flags = sp->kind == W_REQ ? REC_ONESHOT : 0;
  if (lua_getiuservalue(L, rec - 1, LV_RECMT) == LUA_TTABLE) /* (again: a */
    lua_setmetatable(L, rec); /* finalizer may have run since) */
  else
    lua_pop(L, 1);
  lua_pushvalue(L, base + Q_CB - 1);
  lua_setiuservalue(L, rec, RV_CB);
  lua_pushvalue(L, base + Q_FRAME - 1);
  lua_setiuservalue(L, rec, RV_FRAME);
  if (lua_type(L, base + Q_RES - 1) == LUA_TTABLE) r->flags |= REC_RES;
  lua_pushvalue(L, base + Q_RES - 1); /* its resource, else the handle */
  lua_setiuservalue(L, rec, RV_RES);
  for (i = 0; i < sp->nf; i++) {
    lua_pushvalue(L, base + Q_A1 - 1 + i);
    lua_setiuservalue(L, rec, RV_A1 + i);
  }
  lua_replace(L, base);
  lua_settop(L, base);
  return r;
}

/* the quick record at idx is replaced by its record (made if need be;
** allocates) */
ah_rec *ah_luv_q_record(lua_State *L, const ah_luv *lv, int idx) {
  ah_rec *r;
  int base;
  idx = lua_absindex(L, idx);
  if ((r = ah_luv_record(L, lv, idx)) != NULL) return r; /* made before */
  luaL_checkstack(L, AH_LUV_Q_STACK, "async_hooks");
  base = lua_gettop(L) + 1;
  while (lua_gettop(L) - base + 1 < Q_N + 2 &&
         lua_getupvalue(L, idx, lua_gettop(L) - base + 2)) {}
  r = q_build(L, lv, base);
  lua_pushvalue(L, -1);
  lua_setupvalue(L, idx, Q_RES);
  lua_replace(L, idx);
  return r;
}

/* luv calls a quick record without the dispatch in front (after
** uninstall(), or a caller that is not luv): its record is called (its
** __call enters the context, calls the callback protected, restores) */
int ah_luv_q_fn(lua_State *L) {
  int n = lua_gettop(L), i;
  const ah_spec *sp;
  ah_luv *lv;
  luaL_checkstack(L, AH_LUV_Q_STACK, "async_hooks");
  lv = ah_luv_push(L); /* (its upvalues are reachable from Lua: checked) */
  lua_pop(L, 1);
  if ((sp = ah_luv_spec(L, lv, lua_upvalueindex(Q_SPEC))) == NULL) {
    /* the debug library damaged the luv integration: the callback alone,
    ** in no context of its own (an error here would end the process) */
    lua_pushvalue(L, lua_upvalueindex(Q_CB));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
  }
  if (is_record(L, lv, lua_upvalueindex(Q_RES))) {
    lua_pushvalue(L, lua_upvalueindex(Q_RES)); /* made before */
  } else {
    for (i = 1; i <= Q_N + sp->nf; i++) lua_pushvalue(L, lua_upvalueindex(i));
    q_build(L, lv, n + 1);
    lua_copy(L, -1, lua_upvalueindex(Q_RES));
  }
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

/* push a new resource table for the record being made: {handle = h} */
void ah_luv_new_resource(lua_State *L, int spec, int handle_idx, int a1,
                         int a2) {
  int i, v[2];
  const ah_spec *sp = (const ah_spec *)lua_touserdata(L, spec);
  spec = lua_absindex(L, spec);
  handle_idx = handle_idx ? lua_absindex(L, handle_idx) : 0;
  v[0] = a1 ? lua_absindex(L, a1) : 0;
  v[1] = a2 ? lua_absindex(L, a2) : 0;
  lua_createtable(L, 0, 2 + sp->nf);
  lua_getiuservalue(L, spec, SP_KOP);
  lua_getiuservalue(L, spec, SP_OP);
  lua_rawset(L, -3);
  if (handle_idx && !lua_isnil(L, handle_idx)) {
    lua_getiuservalue(L, spec, SP_KHANDLE);
    lua_pushvalue(L, handle_idx);
    lua_rawset(L, -3);
  }
  for (i = 0; i < sp->nf; i++) {
    if (!v[i] || lua_isnil(L, v[i])) continue;
    lua_getiuservalue(L, spec, SP_F1 + i);
    lua_pushvalue(L, v[i]);
    lua_rawset(L, -3);
  }
}

/* push the spec sp (anchored in the state's LV_SPECS; raises if the debug
** library took it away) */
static void push_spec(lua_State *L, const ah_spec *sp) {
  if (ah_luv_push(L) != sp->lv || lua_getiuservalue(L, -1, LV_SPECS) != LUA_TTABLE)
    luaL_error(L, "async_hooks: internal state damaged (the luv specs)");
  lua_rawgetp(L, -1, sp);
  lua_replace(L, -3);
  lua_pop(L, 1);
  if (ah_luv_spec(L, sp->lv, -1) != sp)
    luaL_error(L, "async_hooks: internal state damaged (the luv specs)");
}

/* the resource of the quick record at idx, made now if need be (and kept
** in its Q_RES, or in its record once it has one, so that a handle's keeps
** its identity); pushes it */
static void q_resource(lua_State *L, const ah_luv *lv, int idx) {
  const ah_spec *sp;
  int top = lua_gettop(L);
  idx = lua_absindex(L, idx);
  if (lua_getupvalue(L, idx, Q_RES) && lua_type(L, -1) == LUA_TTABLE) return;
  luaL_checkstack(L, AH_LUV_RES_STACK, "async_hooks");
  lua_getupvalue(L, idx, Q_SPEC);
  sp = ah_luv_spec(L, lv, -1);
  lua_pop(L, 1);
  if (sp == NULL) luaL_error(L, "async_hooks: internal state damaged (a luv quick record)");
  if (is_record(L, sp->lv, -1)) { /* its record's */
    ah_rec *r = (ah_rec *)lua_touserdata(L, -1);
    if (!(r->flags & REC_RES)) ah_luv_materialize(L, r, -1);
    lua_getiuservalue(L, -1, RV_RES);
    lua_replace(L, -2);
    return;
  }
  push_spec(L, sp);                 /* top+2 */
  lua_getupvalue(L, idx, Q_A1);      /* top+3 (none: nil) */
  lua_getupvalue(L, idx, Q_A1 + 1);  /* top+4 */
  lua_settop(L, top + 4);
  ah_luv_new_resource(L, top + 2, top + 1, sp->nf > 0 ? top + 3 : 0,
                      sp->nf > 1 ? top + 4 : 0);
  lua_pushvalue(L, -1);
  lua_setupvalue(L, idx, Q_RES);
  lua_replace(L, top + 1);
  lua_settop(L, top + 1);
}

/* The resource type for init: the spec's, else the handle's __name (the
** last metatable seen and its name are kept in the spec: no string is
** made per init); runs in the wrapper's frame (W_SPEC) */
void ah_luv_push_type(lua_State *L, int handle_idx) {
  if (lua_getiuservalue(L, W_SPEC, SP_TYPE) == LUA_TSTRING) return;
  lua_pop(L, 1);
  if (handle_idx && lua_getmetatable(L, handle_idx)) {
    lua_getiuservalue(L, W_SPEC, SP_TMT);
    if (lua_rawequal(L, -1, -2)) {
      lua_pop(L, 2);
      lua_getiuservalue(L, W_SPEC, SP_TNAME);
      return;
    }
    lua_pop(L, 1);
    lua_pushliteral(L, "__name");
    if (lua_rawget(L, -2) == LUA_TSTRING) {
      lua_pushvalue(L, -1);
      lua_setiuservalue(L, W_SPEC, SP_TNAME);
      lua_rotate(L, -2, 1);
      lua_setiuservalue(L, W_SPEC, SP_TMT);
      return;
    }
    lua_pop(L, 2);
  }
  lua_pushliteral(L, "uv_handle");
}

/* the resource of the record or quick record at 1, made now if need be
** (run protected: a registration luv accepted cannot fail afterwards) */
static int make_resource(lua_State *L) {
  ah_rec *r;
  ah_luv *lv = ah_luv_push(L); /* (a light C function: the debug library
                               ** can call it with anything) */
  lua_settop(L, 1);
  if (lua_tocfunction(L, 1) == ah_luv_q_fn)
    r = ah_luv_q_record(L, lv, 1); /* kept in its Q_RES from now on */
  else
    r = lv ? ah_luv_record(L, lv, 1) : NULL;
  if (r == NULL) return luaL_error(L, "async_hooks: not a luv record");
  if (!(r->flags & REC_RES)) ah_luv_materialize(L, r, 1);
  lua_getiuservalue(L, 1, RV_RES);
  return 1;
}

/* push the resource for the init of the registration at rec (a record r,
** or a quick record when r is NULL) when an init hook can see it, else
** nil.  The type is pushed and the stack reserved first: nothing
** allocates between this decision and the dispatch, so a finalizer cannot
** enable a hook that sees the resource in between */
void ah_luv_push_init_resource(lua_State *L, ah_state *st, ah_rec *r, int rec) {
  if (!rec || !st->init_res) {
    lua_pushnil(L);
  } else if (r && (r->flags & REC_RES)) {
    lua_getiuservalue(L, rec, RV_RES);
  } else {
    lua_pushcfunction(L, make_resource);
    lua_pushvalue(L, rec);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) { /* out of memory: none */
      lua_pop(L, 1);
      lua_pushnil(L);
    }
  }
}

/* the record at idx gets its resource now (executionAsyncResource() was
** called after it was registered): op, handle and the named arguments kept
** in the record; allocates */
void ah_luv_materialize(lua_State *L, ah_rec *r, int idx) {
  int top = lua_gettop(L), nf = r->spec->nf;
  idx = lua_absindex(L, idx);
  luaL_checkstack(L, AH_LUV_RES_STACK, "async_hooks");
  push_spec(L, r->spec);            /* top+1 */
  lua_getiuservalue(L, idx, RV_RES); /* top+2: the handle, or nil */
  lua_getiuservalue(L, idx, RV_A1);  /* top+3 */
  lua_getiuservalue(L, idx, RV_A1 + 1);
  ah_luv_new_resource(L, top + 1, top + 2, nf > 0 ? top + 3 : 0, nf > 1 ? top + 4 : 0);
  lua_setiuservalue(L, idx, RV_RES);
  r->flags |= REC_RES;
  lua_settop(L, top);
}

/* find the innermost frame of the library's uv.run (an inline dispatch ran
** there), below the running function's frames: a C closure whose upvalue
** after the shared ones and its ah_luv is the mark (RUN_MARK); 0 if there is none */
static int run_frame(lua_State *L, lua_Debug *ar) {
  int level;
  for (level = 1; lua_getstack(L, level, ar); level++) {
    int run = 0;
    lua_getinfo(L, "f", ar); /* the function of that level */
    if (lua_tocfunction(L, -1) && lua_getupvalue(L, -1, RUN_MARK_N)) {
      run = lua_touserdata(L, -1) == (void *)&ah_luv_key;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (run) return 1;
  }
  return 0;
}

/* push the value at lv->cur.base + off of that frame: at off 0 the record
** or quick record whose callback runs inline, at D_RES its resource
** when it had one at its entry; 0 (nothing pushed) if not found */
static int push_cur_local(lua_State *L, ah_luv *lv, int off) {
  lua_Debug ar;
  return run_frame(L, &ar) && lua_getlocal(L, &ar, lv->cur.base + off) != NULL;
}

/* the value at the top (popped) becomes the one at lv->cur.base + off of
** that frame; 0 (popped all the same) if not found */
int ah_luv_set_cur_local(lua_State *L, ah_luv *lv, int off) {
  lua_Debug ar;
  if (run_frame(L, &ar) && lua_setlocal(L, &ar, lv->cur.base + off) != NULL) return 1;
  lua_pop(L, 1);
  return 0;
}

/* the value at index idx of the frame ar is the object at p (pushed,
** returns 1), else 0 (nothing pushed) */
static int local_is(lua_State *L, lua_Debug *ar, int idx, const void *p) {
  if (lua_getlocal(L, ar, idx) == NULL) return 0;
  if (lua_topointer(L, -1) == p && lua_type(L, -1) == LUA_TTABLE) return 1;
  lua_pop(L, 1);
  return 0;
}

/* st->sync_frame (ah_frame_sync): F[s] of the thread running an inline
** callback whose frame was not written at its entry (see dispatch.c's
** d_frame) becomes that frame, the value at index pend_idx of the frame
** of the library's uv.run that runs it: the activation record that
** lua_getstack gave there (pend_ci; alive while that frame runs, which the
** note does not outlive).  A live object's address is its own: the value
** there is checked to be the object at pend_ptr, else looked for in the
** frames below the running function (where the debug library moved
** things); not found, F[s] stays as it is.  The note is cleared. */
void ah_luv_sync_frame(lua_State *L, ah_state *st) {
  lua_Debug ar;
  int s = st->pend_frame, level, found = 0;
  st->pend_frame = 0;
  if (!lua_checkstack(L, 2)) return;
  if (st->pend_ci) {
    ar.i_ci = (struct CallInfo *)st->pend_ci;
    found = local_is(L, &ar, st->pend_idx, st->pend_ptr);
  }
  for (level = 1; !found && lua_getstack(L, level, &ar); level++)
    found = local_is(L, &ar, st->pend_idx, st->pend_ptr);
  if (!found) return;
  if (lua_type(L, AH_UVI_F) == LUA_TTABLE) lua_rawseti(L, AH_UVI_F, s);
  else lua_pop(L, 1);
}

/* st->lazy_resource (anchors.c, for executionAsyncResource): while a
** record's callback runs on
** the slow path, R[s] holds the record itself (not anchored: it is on the
** stack meanwhile); inline, the dispatch keeps where the record or quick
** record sits (lv->cur.base, lv->cur).  The value at the top is R[s]:
** replace it by the resource, made now if need be, and return 1 when it is
** the resource of the callback running in slot s; else by false and return
** 0.  The caller then makes it the thread's (R[s], anchored), so later
** calls in the same callback find it at once. */
int ah_luv_resource(lua_State *L, ah_state *st, int s, int t) {
  int top = lua_gettop(L);
  ah_rec *r = NULL;
  ah_luv *lv = NULL;
  luaL_checkstack(L, AH_RESOURCE_STACK, "async_hooks");
  lv = ah_luv_push(L);
  lua_settop(L, top);
  /* no marker: a callback's only if it is the innermost one entered */
  if (t != LUA_TFUNCTION && t != LUA_TUSERDATA &&
      !(lv && lv->cb_n && lv->cb[lv->cb_n - 1] == st->slots[s].id)) {
    lua_pushboolean(L, 0);
    lua_replace(L, top);
    return 0;
  }
  if (lv) r = ah_luv_record(L, lv, top);
  lua_settop(L, top);
  if (!r && lv && lv->cur.base && lv->cur.id == st->slots[s].id && lv->cur.slot == s &&
      push_cur_local(L, lv, 0)) { /* the (quick) record that runs inline */
    lua_Integer trigger;
    if (lua_tocfunction(L, top + 1) == ah_luv_q_fn) {
      if (ah_luv_q_ids(L, top + 1, &trigger) == st->slots[s].id) {
        q_resource(L, lv, top + 1);
        lua_replace(L, top);
        lua_settop(L, top);
        return 1;
      }
    } else if (lv->cur.rec && ah_luv_record(L, lv, top + 1) == lv->cur.rec) {
      lua_replace(L, top);
      r = lv->cur.rec;
    }
    lua_settop(L, top);
  }
  if (!r) {
    lua_pushboolean(L, 0);
    lua_replace(L, top);
    return 0;
  }
  if (r->id != st->slots[s].id) {
    /* re-armed while its callback runs: the record is the new
    ** registration's (and its resource, if it has one now); the running
    ** one's is the one its dispatch holds (it had one at its entry), else
    ** it gets a table of its own */
    if (lv && r == lv->cur.rec && lv->cur.base && lv->cur.slot == s &&
        lv->cur.id == st->slots[s].id && push_cur_local(L, lv, D_RES)) {
      if (lua_type(L, -1) == LUA_TTABLE) {
        lua_replace(L, top);
        lua_settop(L, top);
        return 1;
      }
      lua_settop(L, top);
    }
    push_spec(L, r->spec);
    lua_getiuservalue(L, top, RV_RES);
    if (r->flags & REC_RES) { /* the new resource: take its handle */
      lua_pushliteral(L, "handle");
      lua_rawget(L, -2);
      lua_replace(L, -2);
    }
    ah_luv_new_resource(L, top + 1, top + 2, 0, 0);
    lua_replace(L, top);
    lua_settop(L, top);
    return 1;
  }
  if (!(r->flags & REC_RES)) ah_luv_materialize(L, r, top);
  lua_getiuservalue(L, top, RV_RES);
  lua_replace(L, top);
  return 1;
}

/* push the record's resource, or nil */
void ah_luv_push_resource(lua_State *L, const ah_rec *r, int idx) {
  if (r->flags & REC_RES)
    lua_getiuservalue(L, idx, RV_RES);
  else
    lua_pushnil(L);
}

/* ------------------------------------------------------------------- */
/* a handle's slots: its user value (the record of each callback slot)  */

/* make room for slot in the handle at h (no record there yet), so that
** slot_set cannot fail; 0 if the user value is not ours, AH_SLOT_NIL if it is
** nil (slot_set then need not read it again); allocates */
int ah_luv_slot_reserve(lua_State *L, const ah_luv *lv, int h, int slot) {
  int t = lua_getiuservalue(L, h, 1), ok = 1;
  if (t == LUA_TNIL || t == LUA_TBOOLEAN) { /* true: a quick record's mark */
    ok = AH_SLOT_NIL;
  } else if (t == LUA_TUSERDATA || t == LUA_TFUNCTION) {
    ah_rec *other = ah_luv_record(L, lv, -1);
    if (!other) {
      ok = 0;
    } else if (other->spec->slot != slot) { /* a second slot */
      lua_createtable(L, 0, 2);
      lua_pushvalue(L, -2);
      lua_rawseti(L, -2, other->spec->slot);
      lua_setiuservalue(L, h, 1);
    }
  } else if (t != LUA_TNIL && t != LUA_TTABLE) {
    ok = 0;
  }
  lua_pop(L, 1);
  return ok;
}

/* the record at rec is the registration of (h, slot); room was made
** (reserved: what slot_reserve returned) */
void ah_luv_slot_set(lua_State *L, ah_luv *lv, int h, int slot, int rec,
                     int reserved) {
  if (reserved == AH_SLOT_NIL) {
    lua_pushvalue(L, rec);
    lua_setiuservalue(L, h, 1);
    lv->handles++;
    return;
  }
  if (lua_getiuservalue(L, h, 1) == LUA_TTABLE) {
    lua_pushvalue(L, rec);
    lua_rawseti(L, -2, slot);
  } else {
    lua_pushvalue(L, rec);
    lua_setiuservalue(L, h, 1);
    lv->handles++;
  }
  lua_pop(L, 1);
}

/* the registration of r ends: its destroy */
static void rec_ended(ah_state *st, ah_rec *r) {
  if (r && (r->flags & REC_DESTROY)) {
    r->flags &= (unsigned char)~REC_DESTROY;
    if (st->nhooks[AH_DESTROY]) ah_queue_destroy(st, r->id);
  }
}

/* the same for the record at the top; pops it */
static void ended(lua_State *L, ah_state *st, const ah_luv *lv) {
  rec_ended(st, ah_luv_record(L, lv, -1));
  lua_pop(L, 1);
}

/* the registration of (h, slot) ends (slot 0: every slot of h, which is
** closing); never allocates */
void ah_luv_slot_drop(lua_State *L, ah_state *st, ah_luv *lv, int h,
                      int slot) {
  int t = lua_getiuservalue(L, h, 1);
  if (t == LUA_TTABLE && slot) {
    lua_rawgeti(L, -1, slot);
    ended(L, st, lv);
    lua_pushnil(L);
    lua_rawseti(L, -2, slot);
  } else if (t == LUA_TTABLE) {
    lua_pushnil(L);
    while (lua_next(L, -2)) ended(L, st, lv);
    lua_pushnil(L);
    lua_setiuservalue(L, h, 1);
  } else if (t == LUA_TUSERDATA || t == LUA_TFUNCTION) {
    ah_rec *r = ah_luv_record(L, lv, -1);
    if (r && (!slot || r->spec->slot == slot)) {
      rec_ended(st, r);
      lua_pushnil(L);
      lua_setiuservalue(L, h, 1);
      if (lv->handles > 0) lv->handles--;
    }
  }
  lua_pop(L, 1);
}
