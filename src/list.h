/* One intrusive doubly linked list for every list of hakmem's: a list is
 * any struct with `first` and `last`, its elements any struct with `next`
 * and `prev` (a heap's page queues and full list, the abandoned pages, a
 * region list's regions, the large-block cache). An element on no list has
 * both links NULL. */
#ifndef HK_LIST_H
#define HK_LIST_H

#include <stddef.h>

#define hk_list_remove(list, elem)                     \
  do {                                                 \
    __typeof__(elem) e_ = (elem);                      \
    if (e_->prev) e_->prev->next = e_->next;           \
    else (list)->first = e_->next;                     \
    if (e_->next) e_->next->prev = e_->prev;           \
    else (list)->last = e_->prev;                      \
    e_->next = e_->prev = NULL;                        \
  } while (0)

#define hk_list_push_front(list, elem)                 \
  do {                                                 \
    __typeof__(elem) e_ = (elem);                      \
    e_->prev = NULL;                                   \
    e_->next = (list)->first;                          \
    if ((list)->first) (list)->first->prev = e_;       \
    else (list)->last = e_;                            \
    (list)->first = e_;                                \
  } while (0)

#define hk_list_push_back(list, elem)                  \
  do {                                                 \
    __typeof__(elem) e_ = (elem);                      \
    e_->next = NULL;                                   \
    e_->prev = (list)->last;                           \
    if ((list)->last) (list)->last->next = e_;         \
    else (list)->first = e_;                           \
    (list)->last = e_;                                 \
  } while (0)

/* The elements of `other` after those of `list`, in their order; `other`
 * left empty. */
#define hk_list_append(list, other)                    \
  do {                                                 \
    if ((other)->first) {                              \
      if ((list)->last) (list)->last->next = (other)->first; \
      else (list)->first = (other)->first;             \
      (other)->first->prev = (list)->last;             \
      (list)->last = (other)->last;                    \
      (other)->first = (other)->last = NULL;           \
    }                                                  \
  } while (0)

#endif /* HK_LIST_H */
