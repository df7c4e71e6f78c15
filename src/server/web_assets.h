/* web_assets.h - the chat page's files, built into the binary: the build
 * (src/server/web/embed.cmake) writes every file of src/server/web into a
 * generated C file as byte arrays; web_page.c serves them. */
#ifndef LM_WEB_ASSETS_H
#define LM_WEB_ASSETS_H

#include <stddef.h>

typedef struct srv_asset {
    const char *url;           /* "/" for index.html, "/assets/NAME" for the rest; NULL ends the table */
    const char *type;          /* Content-Type */
    const unsigned char *data; /* NUL-terminated (the NUL is not in len) */
    size_t len;
} srv_asset;

extern const srv_asset srv_web_assets[];

/* The asset served at url, or NULL. */
const srv_asset *srv_web_asset(const char *url);

#endif
