/* Compiled as C so that cospec.h stays usable from C. */
#include "cospec.h"

int cospec_c_header_check(void);

int cospec_c_header_check(void) {
    struct cospec_engine_params ep = cospec_engine_default_params();
    struct cospec_generate_params gp = cospec_generate_default_params();
    return ep.n_ctx > 0 && gp.n_draft > 0;
}
