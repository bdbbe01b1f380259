// zlib, for MainspringHTTP's WebSocket compression (permessage-deflate, RFC 7692).
#include <zlib.h>
