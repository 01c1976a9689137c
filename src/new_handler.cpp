// The one piece of hakmem written in C++: calling a new_handler on behalf of
// a nothrow operator new, which must turn an exception into nullptr. The C++
// runtime's symbols are referenced weakly, so libhakmem still loads (and
// links without libstdc++) in programs that have no C++ runtime; such
// programs never call operator new.
asm(".weak __gxx_personality_v0");
asm(".weak __cxa_begin_catch");
asm(".weak __cxa_end_catch");

// Returns 1 if the handler returned, 0 if it threw.
extern "C" __attribute__((visibility("hidden"))) int hk_call_new_handler_nothrow(void (*handler)()) {
  try {
    handler();
    return 1;
  } catch (...) {
    return 0;
  }
}
