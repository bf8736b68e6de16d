package gateway

import "github.com/warmpath/warmpath/gateway/routing"

// turn is a request on its way through this gateway: the parsed request
// and what admission and routing learn of it (routing.Turn).
type turn = routing.Turn
