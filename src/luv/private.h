/*
** private.h - what the parts of the luv integration share: registration
** (register.c), records (record.c) and dispatch (dispatch.c).  Every
** layout of the luv integration is defined here, once.  Private to those
** three files.
*/
#ifndef AH_LUV_PRIVATE_H
#define AH_LUV_PRIVATE_H

#include "luv.h"
#include "../base.h"
#include "../slots.h"
#include "../anchors.h"
#include "../hooks.h"
#include "../queue.h"

#define AH_CB_INLINE 32 /* entries of the inline callback stack */
/* what making a luv resource pushes (ah_luv_new_resource, with the spec,
** the handle and the named arguments it reads) */
#define AH_LUV_RES_STACK 8
/* what ending a handle's registrations pushes (ah_luv_slot_drop) */
#define AH_LUV_SLOT_STACK 8
/* what turning a quick record into its record pushes: its upvalues and
** the record (ah_luv_q_record, ah_luv_q_fn) */
#define AH_LUV_Q_STACK (Q_N + 8)

typedef int (*ah_luv_pcall)(lua_State *L, int nargs, int nresults, int flags);

typedef struct ah_luv_ctx { /* prefix of luv_ctx_t */
  void *loop;
  lua_State *L;
  ah_luv_pcall cb_pcall;
} ah_luv_ctx;

/* registry[&ah_luv_key]: one per Lua state, never collected before it */
typedef struct ah_luv {
  const void *null;   /* NULL: it is handed out as a light userdata too
                      ** (RUN_LVP; see ah.h, AH_NULLOBJ) */
  const void *self;   /* this very struct (ah_luv_push checks it) */
  ah_luv_ctx *ctx;    /* NULL until attached */
  ah_luv_pcall orig;  /* luv's own cb_pcall */
  ah_state *st;
  lua_CFunction run;  /* luv's uv.run */
  lua_CFunction walk; /* luv's uv.walk: runs its callback at once, through
                      ** cb_pcall (see dispatch.c's in_walk) */
  lua_CFunction is_closing; /* luv's uv.is_closing (see register.c's kept) */
  int closures;       /* a record closure was made (ah_luv_rec_fn, _fn1) */
  int records;        /* a record was made: a callback can be one */
  /* the record whose callback runs inline (dispatch.c), with the asyncId
  ** and slot it runs in: executionAsyncResource() finds it here (saved and
  ** restored as one, around each callback) */
  struct ah_luv_cur {
    struct ah_rec *rec;
    lua_Integer id;
    int slot;
    int wrote; /* R[slot] was written while it runs (see rearm) */
    int base;  /* the running record or quick record is at this index of
               ** the frame of the library's uv.run (the innermost), where
               ** executionAsyncResource() finds it (0: none) */
  } cur;
  int flags; /* or'ed into luv's flags (tests: 1 = no exit, 4 = no message) */
  int handles;                /* tracked handle registrations (upper bound) */
  lua_Integer fast_callbacks; /* callbacks that took the no-Lua path */
  int closed;                 /* finalized (lua_close): nothing allocates */
  lua_Integer *cb;            /* native stack of entered records' ids */
  size_t cb_n, cb_cap;
  lua_Integer cb_inline[AH_CB_INLINE];
} ah_luv;

extern const void *const ah_luv_key;
/* the ah_luv at idx, or NULL (it is reachable from Lua) */
static inline ah_luv *ah_luv_at(lua_State *L, int idx) {
  ah_luv *lv = (ah_luv *)lua_touserdata(L, idx);
  return lv && lua_rawlen(L, idx) == sizeof(ah_luv) && lv->self == lv ? lv : NULL;
}
ah_luv *ah_luv_push(lua_State *L);
const struct ah_spec *ah_luv_spec(lua_State *L, const ah_luv *lv, int idx);
/* luv's cb_pcall, kept for a state whose ah_luv the debug library took
** away (luv keeps calling ours) */
extern ah_luv_pcall ah_luv_fallback;

/* user values of the ah_luv userdata */
enum {
  LV_ENTER = 1, /* protected enter closure (the slow path) */
  LV_LEAVE,     /* protected leave closure */
  LV_FLUSH,     /* protected destroy flush */
  LV_RECMT,     /* metatable of records */
  LV_SPECS,     /* spec -> spec (keeps specs alive) */
  LV_NUV = LV_SPECS
};

/* kinds of wrapped functions */
enum { W_HANDLE = 0, W_CREATE, W_CLOSE, W_REQ, W_WORK };

/* One per wrapped luv function, anchored in LV_SPECS for the life of the
** state (records point to it).  User values: the op name (the luv
** function's name), the resource type (nil: the handle's type). */
typedef struct ah_spec {
  const void *self;   /* this very struct (ah_luv_spec checks it) */
  struct ah_luv *lv;  /* the state's (a spec belongs to one state) */
  lua_CFunction orig;
  int kind;
  int pos, alt; /* callback position; alternative when pos is nil/absent */
  int slot;     /* callback slot of handle registrations (1-based) */
  int fn;       /* luv accepts only a function there: a record closure */
  int nf, f[2]; /* named arguments copied into the resource: positions */
} ah_spec;
/* user values: op name, resource type (or nil), names of the named args */
enum { SP_OP = 1, SP_TYPE, SP_F1, SP_F2,
       SP_TMT, SP_TNAME, /* last handle metatable seen by init, its __name */
       SP_KOP, SP_KHANDLE, /* the strings "op" and "handle" (resource keys:
                           ** a raw set, no C string to intern) */
       SP_NUV = SP_KHANDLE };

/* A registration.  User values: the callback, the frame, the resource
** table (REC_RES set) or else the handle (or nil), then (specs with named
** arguments, resource not made) the values of those arguments. */
typedef struct ah_rec {
  const struct ah_luv *lv; /* marks a record of this state */
  lua_Integer id, trigger;
  const ah_spec *spec;
  const void *frame; /* identity of the frame user value */
  unsigned flags : 8;
  unsigned fslot : 24; /* frame was F[fslot] when st->fgen was fgen */
  unsigned fgen;
} ah_rec;
#define AH_FSLOT_MAX 0xFFFFFF /* fslot of a slot this large: unknown */
enum { RV_CB = 1, RV_FRAME, RV_RES, RV_A1, RV_N = RV_RES };
enum {
  REC_ONESHOT = 1, /* a request or close callback: destroyed after it ran */
  REC_RES = 2,     /* RV_RES holds the resource (else the handle) */
  REC_DESTROY = 4  /* destroy hooks saw its init: its destroy is due */
};

/* A quick record: what a registration that nothing but a frame observes
** (no init or destroy hook enabled, executionAsyncResource() never called)
** hands luv instead of a record, for requests and for the first
** registration on a fresh handle: a C closure (ah_luv_q_fn) whose
** upvalues are the record's fields.  One allocation, and a function, which
** luv's callable check takes at once (a record costs it a __call lookup).
** The dispatch reads the upvalues where it reads a record's user values;
** luv calling it without the dispatch in front (after uninstall()) turns it
** into a record first.  Upvalues: */
enum {
  Q_CB = 1, Q_FRAME,
  Q_IDS,  /* the asyncId and triggerAsyncId, one integer (ah_luv_q_pack) */
  Q_SPEC, /* the spec (its userdata: ah_luv_spec checks it) */
  Q_RES,  /* the resource once made (a table), else the handle (or nil) */
  Q_A1,   /* then, specs with named arguments: their values */
  Q_N = Q_RES
};

/* Closure layouts.  A record closure: rec_fn (a registration luv takes
** only a function for) has the shared upvalues and the record after
** them; rec_fn1 (a re-armed handle slot) the record alone. */
#define RF_REC_N (AH_NUP + 1)
#define RF_REC lua_upvalueindex(RF_REC_N)
#define RF1_REC_N 1

/* a wrapper of a callback-taking luv function, after the shared ones */
#define W_SPEC lua_upvalueindex(AH_NUP + 1)
#define W_LV lua_upvalueindex(AH_NUP + 2)
#define W_RECMT lua_upvalueindex(AH_NUP + 3) /* the records' metatable */
#define W_NUP (AH_NUP + 3)

/* the slow dispatch's enter and leave closures: the ah_luv */
#define E_LV lua_upvalueindex(AH_NUP + 1)

/* Upvalues of the library's uv.run, after the shared ones: the ah_luv,
** two nils, and last the mark that dispatch.c's cb_pcall looks for in
** the running function.  No other core closure has that many upvalues, so
** none can hold the mark where it is looked for, whatever the debug
** library put in its upvalues. */
#define RUN_LV lua_upvalueindex(AH_NUP + 1)
#define RUN_LVP lua_upvalueindex(AH_NUP + 2) /* RUN_LV as a light pointer (the
                                             ** quickest to read: checked by
                                             ** ah_luv_run, used by cb_pcall) */
#define RUN_NUP (AH_NUP + 4)
#define RUN_MARK_N RUN_NUP
#define RUN_MARK lua_upvalueindex(RUN_MARK_N)
typedef char ah_run_mark_unique[RUN_NUP > W_NUP && RUN_NUP > RF_REC_N &&
                                RUN_NUP > Q_N + 2 ? 1 : -1];

/* The inline dispatch's values, at base + D_* of the frame of the
** library's uv.run (base: the callback's index): the thread's previous
** resource and frame, the record's resource (nil: none at its entry) and
** frame.  lv->cur.base + D_RES is where a running record's resource is
** found (record.c) and kept across a re-arm (register.c). */
enum { D_PRES = 1, D_PFRAME, D_RES, D_FRAME, D_NSAVED = D_FRAME };

/* Q_IDS: the asyncId in the high bits, in the low AH_Q_TBITS the distance
** back to the triggerAsyncId (0: the trigger is 0).  A registration whose
** ids do not fit takes a record instead (register.c's track_q). */
#define AH_Q_TBITS 21
#define AH_Q_TMASK (((lua_Integer)1 << AH_Q_TBITS) - 1)
#define AH_Q_IDMAX ((lua_Integer)1 << (62 - AH_Q_TBITS))
static inline int ah_luv_q_pack(lua_Integer id, lua_Integer trigger,
                                lua_Integer *ids) {
  lua_Integer t = trigger == 0 ? 0 : id - trigger;
  if (id <= 0 || id >= AH_Q_IDMAX || trigger < 0 || trigger >= id ||
      t > AH_Q_TMASK)
    return 0;
  *ids = (lua_Integer)((lua_Unsigned)id << AH_Q_TBITS) | t;
  return 1;
}
static inline lua_Integer ah_luv_q_unpack(lua_Integer ids, lua_Integer *trigger) {
  lua_Integer id = (lua_Integer)((lua_Unsigned)ids >> AH_Q_TBITS), t = ids & AH_Q_TMASK;
  *trigger = t ? id - t : 0;
  return id;
}

/* the asyncId of the quick record at idx, and its triggerAsyncId (the
** dispatch reads them on every quick record's callback: inline) */
static inline lua_Integer ah_luv_q_ids(lua_State *L, int idx, lua_Integer *trigger) {
  lua_Integer ids;
  lua_getupvalue(L, idx, Q_IDS);
  ids = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return ah_luv_q_unpack(ids, trigger);
}


/* the userdata at idx if it is a record of lv (ah_luv_record without the
** record closures), for the dispatch's hot paths */
static inline ah_rec *ah_luv_rec_at(lua_State *L, const ah_luv *lv, int idx) {
  ah_rec *r = (ah_rec *)lua_touserdata(L, idx);
  return r && lua_rawlen(L, idx) == sizeof(ah_rec) && r->lv == lv ? r : NULL;
}

/* the native stack of entered records' ids (lv->cb): the innermost one
** is the callback that runs; grown on the heap past AH_CB_INLINE entries
** (record.c), back when it empties */
AH_COLD int ah_luv_cb_grow(ah_luv *lv);
AH_COLD void ah_luv_cb_shrink(ah_luv *lv);
static inline int cb_push(ah_luv *lv, lua_Integer id) {
  if (ah_unlikely(lv->cb_n == lv->cb_cap) && !ah_luv_cb_grow(lv)) return 0;
  lv->cb[lv->cb_n++] = id;
  return 1;
}
static inline void cb_pop(ah_luv *lv) {
  lv->cb_n--;
  if (ah_unlikely(lv->cb != lv->cb_inline) && lv->cb_n <= AH_CB_INLINE / 2)
    ah_luv_cb_shrink(lv);
}

/* dispatch.c */
int ah_luv_rec_call(lua_State *L);
int ah_luv_cb_pcall(lua_State *L, int nargs, int nresults, int flags);
int ah_luv_run(lua_State *L);
void ah_luv_closures(lua_State *L, int lvi);

/* record.c */
int ah_luv_rec_fn(lua_State *L);
int ah_luv_rec_fn1(lua_State *L);
int ah_luv_q_fn(lua_State *L);
ah_rec *ah_luv_record(lua_State *L, const ah_luv *lv, int idx);
ah_rec *ah_luv_q_record(lua_State *L, const ah_luv *lv, int idx);
void ah_luv_push_resource(lua_State *L, const ah_rec *r, int idx);
void ah_luv_materialize(lua_State *L, ah_rec *r, int idx);
int ah_luv_set_cur_local(lua_State *L, ah_luv *lv, int off);
void ah_luv_new_resource(lua_State *L, int spec, int handle_idx, int a1, int a2);
int ah_luv_resource(lua_State *L, ah_state *st, int s, int t);
void ah_luv_sync_frame(lua_State *L, ah_state *st);
void ah_luv_push_init_resource(lua_State *L, ah_state *st, ah_rec *r, int rec);
void ah_luv_push_type(lua_State *L, int handle_idx);
/* a handle's registrations, kept in its user value: a record, or
** {slot -> record} for one with registrations in several slots */
#define AH_SLOT_NIL 2 /* ah_luv_slot_reserve: the user value is nil */
int ah_luv_slot_reserve(lua_State *L, const ah_luv *lv, int h, int slot);
void ah_luv_slot_set(lua_State *L, ah_luv *lv, int h, int slot, int rec,
                     int reserved);
void ah_luv_slot_drop(lua_State *L, ah_state *st, ah_luv *lv, int h,
                      int slot);

#endif
