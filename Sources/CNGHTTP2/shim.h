// nghttp2 (Debian's libnghttp2-dev), for MainspringHTTP's HTTP/2: the library behind curl's and
// nginx's HTTP/2. Only MainspringHTTP's NGHTTP2/ folder imports it.
#include <nghttp2/nghttp2.h>
