/*
** queue.c - the destroy queue (see queue.h).
*/
#include <stdlib.h>

#include "queue.h"

/* queue the destroy of id; runs in finalizers: no Lua call, no error */
void ah_queue_destroy(ah_state *st, lua_Integer id) {
  if (ah_unlikely(st->closed)) return; /* lua_close: nothing allocates */
  if (st->dq_n == st->dq_cap) {
    size_t ncap = st->dq_cap ? st->dq_cap * 2 : 16;
    lua_Integer *n = realloc(st->dq, ncap * sizeof(lua_Integer));
    if (!n) return; /* out of memory in a finalizer: the event is lost */
    st->dq = n;
    st->dq_cap = ncap;
  }
  st->dq[st->dq_n++] = id;
}

void ah_queue_free(ah_state *st) {
  free(st->dq);
  st->dq = NULL;
  st->dq_n = st->dq_cap = 0;
}
