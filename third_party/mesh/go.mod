module github.com/weaveworks/mesh

go 1.12

require (
	github.com/stretchr/testify v1.4.0
	golang.org/x/crypto v0.0.0-20191002192127-34f69633bfdc
)
