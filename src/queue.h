/*
** queue.h - the destroy queue: ids whose destroy is due, queued where no
** Lua code may run (finalizers) and delivered at the next flush point
** (hooks.h's ah_flush).
*/
#ifndef AH_QUEUE_H
#define AH_QUEUE_H

#include "ah.h"

void ah_queue_destroy(ah_state *st, lua_Integer id);
/* the state is closed: the queue's memory goes, nothing is queued again */
void ah_queue_free(ah_state *st);

#endif
