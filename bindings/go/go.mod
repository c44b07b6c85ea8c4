module swiftkv.dev/bindings

go 1.19
